"""The tenant finalizer: added before anything else is done, removed once the tenant is dropped
(or there never was one), together with the credentials Secret and the object itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from domain.constants import FINALIZER_TENANT
from domain.resources import DATABASES
from informers import Rest
from reconciler.database.secret import CredentialsSecrets
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites

log = logging.getLogger(__name__)


@dataclass
class Finalizers:
    """Adds the tenant finalizer first, removes it last."""

    rest: Rest
    writes: DatabaseWrites
    secrets: CredentialsSecrets

    def add(self, database: Database) -> bool:
        """Add the tenant finalizer; False when the object is gone already."""
        if not self.writes.metadata(database, {"finalizers": [*database.finalizers, FINALIZER_TENANT]}):
            return False
        database.load(database.db)
        return True

    def finish_delete(self, database: Database) -> None:
        """Remove the credentials Secret and the object itself (no garbage collector is relied on)."""
        self.secrets.delete(database)
        if not self.writes.metadata(
            database, {"finalizers": [f for f in database.finalizers if f != FINALIZER_TENANT]}
        ):
            return  # deleted meanwhile: the delete is done
        if not database.deleting:
            try:
                self.rest.delete(DATABASES, database.name, database.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        log.info("database deleted", extra={"database": database.name})
