"""Fixtures of the Patroni suite: shards as users run them (harness/patroni.py), a Patroni cluster of a
primary and a streaming replica behind a primary endpoint, with pgBouncer as the client endpoint, and
the provider's controllers in this process under a release of their own (names prefixed `pgbtest`).

One cluster per PostgreSQL major and pool mode for the whole run (about 15 s each to start): tests
isolate themselves by Database name.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_ROTATE_OVERLAP,
    ANNOTATION_ROTATE_REQUESTED_AT,
)
from domain.resources import DATABASES, SHARDS
from harness.patroni import POOLER_AUTH_USER, PatroniShard
from tests.support.common import shard_object
from tests.support.fleet import Fleet as BaseFleet
from tests.support.install import Release, release_fixtures

NAMESPACE = "pgbtest-system"
RELEASE = Release("pgbtest", NAMESPACE, "pgbtest-shards")


class Fleet(BaseFleet):
    release = RELEASE
    consumer = "pgbtest-consumer"

    def patroni_shard(self, cluster: PatroniShard, *, pooler: bool = True, direct: bool = False) -> str:
        """A Shard as a platform engineer declares a Percona cluster: the admin endpoint is the primary
        endpoint, the client endpoint pgBouncer (with `client.pooler` unless told otherwise), or with
        `direct` the primary endpoint too (a shard before pgBouncer)."""
        name = self.name(f"patroni{cluster.major}")
        client = {"host": "127.0.0.1", "port": cluster.port if direct else cluster.client_port, "sslmode": "require"}
        if pooler and not direct:
            client["pooler"] = {"authUser": POOLER_AUTH_USER, "template": "template1"}
        spec = {
            "maxDatabases": 200,
            "perconaCluster": {"namespace": "databases", "name": name},
            "admin": {
                "serviceName": f"{name}-primary",
                "port": cluster.port,
                "sslmode": "require",
                "secretRef": {
                    "namespace": self.release.shard_secrets_namespace,
                    "name": self.admin_secrets.secret(cluster.PROVISIONER, cluster.provisioner_password),
                },
            },
            "client": client,
        }
        self.rest.create(SHARDS, shard_object(name, spec))
        self.shards.append(name)
        return name

    def request_delete(self, name: str) -> None:
        self.annotate_now(name, ANNOTATION_DELETE_REQUESTED_AT)

    def rotate_with_overlap(self, name: str, seconds: int) -> dict[str, Any]:
        """Request a rotation with an overlap as the rotate route records it; the Database once it is applied."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # as the rotate route stamps it: distinct
        annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: str(seconds)}
        self.rest.patch(DATABASES, name, {"metadata": {"annotations": annotations}}, self.namespace)
        return self.wait_database(name, lambda db: db["status"].get("rotationApplied") == stamp, timeout=60)


def connect(creds: dict[str, str], password: str | None = None) -> psycopg.Connection:
    """A consumer's session with its credentials Secret (through pgBouncer), autocommit."""
    return psycopg.connect(
        host=creds["host"],
        port=int(creds["port"]),
        user=creds["user"],
        password=password if password is not None else creds["password"],
        dbname=creds["database"],
        sslmode=creds["sslmode"],
        connect_timeout=10,
        autocommit=True,
    )


def works(conn: psycopg.Connection) -> bool:
    """Whether a session still runs a statement (False once it was ended, here or behind pgBouncer)."""
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def ready_database(fleet: Fleet, cluster: PatroniShard, start_manager, external_id: str, size_class: str = "") -> str:
    """A Database of `external_id` on a Shard of `cluster` behind its pgBouncer, once it is Ready."""
    fleet.patroni_shard(cluster)
    start_manager()
    name = fleet.database(external_id, size_class=size_class)
    fleet.wait_reason(name, "Ready", "Provisioned", timeout=120)
    return name


installed, provider_client, admin_rest, start_manager, fleet = release_fixtures(RELEASE, Fleet)


@pytest.fixture(scope="session")
def patroni18() -> Iterator[PatroniShard]:
    """PostgreSQL 18 under Patroni, pgBouncer in transaction pool mode."""
    with PatroniShard("18", pool_mode="transaction") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def patroni16() -> Iterator[PatroniShard]:
    """PostgreSQL 16 under Patroni, pgBouncer in session pool mode."""
    with PatroniShard("16", pool_mode="session") as cluster:
        yield cluster
