"""The Shards and Databases a controller test creates, playing the platform engineer and the API.

Suites subclass `Fleet` for what only they create (the Cloudberry suite's Keldon clusters).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_RESTORE_TENANT, API_VERSION
from domain.naming import database_object_name
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from informers import SECRETS, Resource, Rest
from tests.support.admin_secrets import AdminSecrets
from tests.support.common import condition, decoded, now_stamp, shard_object, wait_for
from tests.support.install import Release


def ignore_missing(call: Callable[[], Any]) -> None:
    """Run a delete (or any call) that may find its object already gone."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def gone(rest: Rest, resource: Resource, name: str, namespace: str | None = None) -> bool:
    try:
        rest.get(resource, name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


class Fleet:
    """Creates Shards (with their admin Secrets, listed in shardSecrets) and Databases of one release,
    and removes them all afterwards. Shards use TLS (sslmode require) unless a test asks otherwise."""

    release: Release  # set by the suite's subclass
    consumer = "consumer"

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.namespace = self.release.namespace
        self.suffix = uuid.uuid4().hex[:6]
        self.counter = itertools.count()
        self.shards: list[str] = []
        self.admin_secrets = AdminSecrets(rest, self.release.name, self.release.shard_secrets_namespace)
        self.databases: list[str] = []

    def name(self, kind: str) -> str:
        """A fresh object name of this fleet."""
        return f"{self.release.name}-{kind}-{self.suffix}-{next(self.counter)}"

    # -- Shards --------------------------------------------------------------------------------

    def admin_secret(self, server: PostgresServer, password: str | None = None) -> dict[str, str]:
        """The secretRef of a listed admin Secret holding the server's provisioner (or `password`)."""
        secret = password if password is not None else server.provisioner_password
        name = self.admin_secrets.secret(server.PROVISIONER, secret)
        return {"namespace": self.release.shard_secrets_namespace, "name": name}

    def shard(
        self,
        postgres: PostgresServer,
        *,
        name: str | None = None,
        max_databases: int = 50,
        accepting: bool = True,
        client_host: str = "127.0.0.1",
        client_port: int | None = None,
        password: str | None = None,
        port: int | None = None,
        sslmode: str = "require",
        secret_ref: dict[str, str] | None = None,
        client_sslmode: str = "require",
    ) -> str:
        """A postgres Shard on `postgres`; `secret_ref` replaces the listed admin Secret the fleet
        writes (tests of unlisted ones); the client endpoint is the server itself unless given."""
        name = name or self.name(f"pg{postgres.major}")
        spec = {
            "accepting": accepting,
            "maxDatabases": max_databases,
            "perconaCluster": {"namespace": "databases", "name": name},
            "admin": {
                "serviceName": f"{name}-primary",
                "port": port or postgres.port,
                "sslmode": sslmode,
                "secretRef": secret_ref or self.admin_secret(postgres, password),
            },
            # The server itself by default: a new database is Ready only once its credentials log in there.
            "client": {"host": client_host, "port": client_port or postgres.port, "sslmode": client_sslmode},
        }
        return self.create_shard(name, spec, postgres)

    def create_shard(self, name: str, spec: dict[str, Any], server: PostgresServer) -> str:
        self.rest.create(SHARDS, shard_object(name, spec))
        self.shards.append(name)
        return name

    def get_shard(self, name: str) -> dict[str, Any]:
        return self.rest.get(SHARDS, name)

    def wait_shard(self, name: str, reason: str, message: str = "", timeout: float = 30) -> dict[str, Any]:
        """Wait until the Shard's Ready condition has `reason` (Ok means Ready=True) and a message
        containing `message`; the Shard."""

        def probe() -> dict[str, Any] | None:
            shard = self.get_shard(name)
            ready = condition(shard, "Ready")
            if ready is None or ready["reason"] != reason or message not in ready.get("message", ""):
                return None
            return shard

        return wait_for(probe, timeout=timeout, what=f"shard {name} to report {reason} {message!r}")

    def admin_secret_of(self, shard: str) -> tuple[str, str]:
        """(name, namespace) of the Shard's admin Secret."""
        ref = self.get_shard(shard)["spec"]["admin"]["secretRef"]
        return ref["name"], ref["namespace"]

    # -- Databases -----------------------------------------------------------------------------

    def create_database(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> str:
        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if annotations:
            metadata["annotations"] = annotations
        body = {"apiVersion": API_VERSION, "kind": "Database", "metadata": metadata, "spec": spec}
        self.rest.create(DATABASES, body, self.namespace)
        self.databases.append(name)
        return name

    def database(self, external_id: str, consumer: str | None = None, size_class: str = "") -> str:
        consumer = consumer or self.consumer
        spec = {"consumer": consumer, "externalId": external_id, "sizeClass": size_class}
        return self.create_database(database_object_name(consumer, external_id), spec)

    def restore(self, name: str, consumer: str, external_id: str, shard: str, tenant: str) -> str:
        """A Database re-created by an operator on an existing tenant (the restore-tenant annotation)."""
        spec = {"consumer": consumer, "externalId": external_id}
        return self.create_database(name, spec, {ANNOTATION_RESTORE_TENANT: f"{shard}/{tenant}"})

    def get_database(self, name: str) -> dict[str, Any] | None:
        """The Database, or None once it is gone."""
        try:
            return self.rest.get(DATABASES, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def wait_database(
        self, name: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60, what: str = ""
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            db = self.get_database(name)
            return db if db is not None and check(db) else None

        return wait_for(probe, timeout=timeout, what=what or f"database {name}")

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait_database(
            name, lambda db: (db.get("status") or {}).get("phase") == phase, timeout, f"{name} to be {phase}"
        )

    def wait_reason(self, name: str, phase: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the Database is in `phase` with Ready's reason `reason` (Ready: Ready=True too)."""

        def matches(db: dict[str, Any]) -> bool:
            cond = condition(db, "Ready")
            return (db.get("status") or {}).get("phase") == phase and cond is not None and cond["reason"] == reason

        return self.wait_database(name, matches, timeout, f"{name} to be {phase}/{reason}")

    def annotate_now(self, name: str, annotation: str) -> str:
        """Stamp a request annotation (delete, rotate) with the current time; the stamp."""
        stamp = now_stamp()
        self.rest.patch(DATABASES, name, {"metadata": {"annotations": {annotation: stamp}}}, self.namespace)
        return stamp

    def credentials(self, name: str) -> dict[str, str]:
        """The decoded credentials Secret of Database `name`."""
        return decoded(self.rest.get(SECRETS, f"{name}-credentials", self.namespace))

    # -- cleanup -------------------------------------------------------------------------------

    def cleanup(self) -> None:
        for name in self.databases:
            with contextlib.suppress(ApiException):  # already gone
                self.rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, self.namespace)
                self.rest.delete(DATABASES, name, self.namespace)
            with contextlib.suppress(ApiException):
                self.rest.delete(SECRETS, f"{name}-credentials", self.namespace)
        for name in self.shards:
            with contextlib.suppress(ApiException):  # the Shard finalizer: no manager may be left to remove it
                self.rest.patch(SHARDS, name, {"metadata": {"finalizers": None}})
                self.rest.delete(SHARDS, name)
        self.admin_secrets.cleanup()
