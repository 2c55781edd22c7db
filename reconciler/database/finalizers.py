"""The tenant finalizer: added before anything else is done, removed once the tenant is dropped
(or there never was one), together with the credentials Secret and the object itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from domain.constants import FINALIZER_TENANT
from informers import Rest
from reconciler.database.secret import CredentialsSecrets
from reconciler.database.state import Pass
from reconciler.database.writes import DatabaseWrites
from reconciler.resources import DATABASES

log = logging.getLogger(__name__)


def finalizers(p: Pass) -> list[str]:
    return list(p.meta.get("finalizers") or [])


@dataclass
class Finalizers:
    """Adds the tenant finalizer first, removes it last."""

    rest: Rest
    writes: DatabaseWrites
    secrets: CredentialsSecrets

    def add(self, p: Pass) -> bool:
        """Add the tenant finalizer; False when the object is gone already."""
        if not self.writes.metadata(p, {"finalizers": [*finalizers(p), FINALIZER_TENANT]}):
            return False
        p.load(p.db)
        return True

    def finish_delete(self, p: Pass) -> None:
        """Remove the credentials Secret and the object itself (no garbage collector is relied on)."""
        self.secrets.delete(p)
        if not self.writes.metadata(p, {"finalizers": [f for f in finalizers(p) if f != FINALIZER_TENANT]}):
            return  # deleted meanwhile: the delete is done
        if not p.meta.get("deletionTimestamp"):
            try:
                self.rest.delete(DATABASES, p.name, p.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        log.info("database deleted", extra={"database": p.name})
