"""A claim's database moved to another shard reaches the consumer: once a DatabaseMove has moved it
online between two real PostgreSQL 18 servers, the provider's credentials route and the claim's
Secret (written by the agent) carry the target's endpoint with the same username and password, a
client logging in with the Secret's values reaches the target and finds the rows written before the
move, and the claim stays Ready; a rollback brings the source's endpoint back the same way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException

from dbprovider.devstack import DevStack
from domain.constants import ANNOTATION_CREDENTIALS_VERSION, API_VERSION
from domain.naming import claim_database_id, database_object_name
from domain.resources import CLAIMS, DATABASE_MOVES, DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from informers import Rest
from tests.agent.conftest import Consumer, movable_server
from tests.agent.test_agent import decoded, provider_get, provider_view, ready_claim, refused
from tests.sql.conftest import LogicalPool
from tests.support.admin_secrets import AdminSecrets
from tests.support.common import condition, shard_object, unique, wait_for
from tests.support.fleet import ignore_missing
from tests.support.postgres import PostgresPool

ENDPOINT_KEYS = {"host", "port", "uri"}


@pytest.fixture(scope="module")
def target(stack: DevStack, kube: KubeControlPlane) -> Iterator[tuple[str, PostgresServer]]:
    """A second Shard of the stack's release on a server of its own, ready for online moves (as the
    stack's shard is); it takes no new placements, so claims land on the stack's shard. Its name and server.

    The stream of a move (and the stream back of a rollback) logs in to the other shard's client
    endpoint from the server itself; the harness' servers may not read the client certificate libpq
    looks for under the test runner's HOME, which sslmode=require would insist on, so both client
    endpoints prefer TLS meanwhile (as in tests/reconciler/test_move.py)."""
    pool = PostgresPool(settings=LogicalPool.SETTINGS)
    server = movable_server(pool)
    name = unique("agent-target")
    with kube.admin_client() as client:
        rest = Rest(client)
        secrets = AdminSecrets(rest, stack.config.release_name, stack.shard_secrets_namespace)
        admin = {
            "serviceName": f"{name}-primary",
            "port": server.port,
            "sslmode": "require",
            "secretRef": {
                "namespace": stack.shard_secrets_namespace,
                "name": secrets.secret(server.PROVISIONER, server.provisioner_password),
            },
        }
        spec = {
            "accepting": False,
            "maxDatabases": 10,
            "perconaCluster": {"namespace": stack.namespace, "name": name},
            "admin": admin,
            "client": {"host": "127.0.0.1", "port": server.port, "sslmode": "prefer"},
        }
        rest.create(SHARDS, shard_object(name, spec))
        rest.patch(SHARDS, stack.shard, {"spec": {"client": {"sslmode": "prefer"}}})
        try:
            wait_for(lambda: ready(rest.get(SHARDS, name)), 60, "the target Shard Ready")
            yield name, server
        finally:
            rest.patch(SHARDS, stack.shard, {"spec": {"client": {"sslmode": "require"}}})
            ignore_missing(lambda: rest.delete(SHARDS, name))
            ignore_missing(lambda: rest.patch(SHARDS, name, {"metadata": {"finalizers": None}}))
            secrets.cleanup()
            pool.close()


def ready(obj: dict[str, Any]) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


@contextlib.contextmanager
def requested_move(rest: Rest, stack: DevStack, database: str, target: str) -> Iterator[str]:
    """A DatabaseMove of the Database object `database` to the Shard `target`; its name. Removed afterwards
    (finalizer included: a failed test leaves no object waiting for a rollback window)."""
    name = unique("move")
    body = {
        "apiVersion": API_VERSION,
        "kind": "DatabaseMove",
        "metadata": {"name": name, "namespace": stack.namespace},
        "spec": {"database": database, "target": target},
    }
    rest.create(DATABASE_MOVES, body, stack.namespace)
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            rest.patch(DATABASE_MOVES, name, {"metadata": {"finalizers": None}}, stack.namespace)
            rest.delete(DATABASE_MOVES, name, stack.namespace)


def serving(values: dict[str, str]) -> tuple[int, list[tuple[Any, ...]]]:
    """Log in with exactly the Secret's URI: the port of the server that answered, and the tenant's rows."""
    with psycopg.connect(values["uri"], connect_timeout=10) as conn:
        port = conn.execute("SELECT inet_server_port()").fetchone()
        rows = conn.execute("SELECT id, note FROM orders ORDER BY id").fetchall()
    assert port is not None
    return int(port[0]), rows


@pytest.fixture
def claim(consumer: Consumer) -> Iterator[dict[str, Any]]:
    """A Ready claim, deleted afterwards (the stack's shard has room for the suite's databases only)."""
    created, _ = ready_claim(consumer)
    yield created
    meta = created["metadata"]
    consumer.admin.delete(CLAIMS, meta["name"], meta["namespace"])
    wait_for(lambda: consumer.get_claim(created) is None, 60, "the claim gone", max_interval=0.5)


def test_a_moved_database_reaches_the_claims_secret_and_a_rollback_brings_it_back(
    consumer: Consumer,
    stack: DevStack,
    kube: KubeControlPlane,
    target: tuple[str, PostgresServer],
    claim: dict[str, Any],
) -> None:
    target_shard, target_server = target
    source_port = stack.postgres.port
    meta = claim["metadata"]
    db_id = claim_database_id(meta["namespace"], meta["name"])
    database = database_object_name(stack.consumer, db_id)

    def secret_with(**wanted: str) -> dict[str, str] | None:
        secret = consumer.secret(meta["namespace"], meta["name"])
        values = decoded(secret) if secret else {}
        return values if wanted.items() <= values.items() else None

    before = wait_for(lambda: secret_with(port=str(source_port), sslmode="prefer"), 60, "the claim's Secret")
    with psycopg.connect(before["uri"], autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO orders VALUES (1, 'before the move')")
    version = provider_view(stack, db_id)["credentialsVersion"]

    def secret_version() -> str | None:
        secret = consumer.secret(meta["namespace"], meta["name"]) or {}
        return ((secret.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CREDENTIALS_VERSION)

    def claim_version() -> str | None:
        return ((consumer.get_claim(claim) or {}).get("status") or {}).get("credentialsVersion")

    version_before = wait_for(lambda: claim_version() == secret_version() and claim_version(), 30, "the version")

    def credentials_on(port: int) -> dict[str, Any] | None:
        """The provider's credentials route's answer, once it names `port` (its cache follows the switch)."""
        answer = provider_get(stack, f"/v1/databases/{db_id}/credentials")
        return answer if answer["port"] == port else None

    with kube.admin_client() as client:
        rest = Rest(client)

        def reached(name: str, phase: str) -> bool:
            """The move in `phase`; meanwhile the claim stays Ready (its Secret's values are usable)."""
            assert consumer.condition(claim, "Ready")["status"] == "True"
            status = rest.get(DATABASE_MOVES, name, stack.namespace).get("status") or {}
            assert status.get("phase") != "Failed", status
            return status.get("phase") == phase

        with requested_move(rest, stack, database, target_shard) as name:
            wait_for(lambda: reached(name, "Completed"), 180, "the move", max_interval=0.5)
            assert rest.get(DATABASES, database, stack.namespace)["status"]["shard"] == target_shard
            # The provider hands out the target's endpoint; the source refuses the values the Secret
            # held so far, so only a Secret the agent rewrote can reach the database from here on.
            answer = wait_for(lambda: credentials_on(target_server.port), 60, "the target in the credentials route")
            assert (answer["user"], answer["password"]) == (before["username"], before["password"])
            assert provider_view(stack, db_id)["credentialsVersion"] != version
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                psycopg.connect(before["uri"], connect_timeout=10).close()

            moved = wait_for(
                lambda: secret_with(port=str(target_server.port)), 60, "the target in the Secret", max_interval=0.5
            )
            assert {k: v for k, v in moved.items() if k not in ENDPOINT_KEYS} == {
                k: v for k, v in before.items() if k not in ENDPOINT_KEYS
            }  # username, password, database, sslmode and CA as before
            assert serving(moved) == (target_server.port, [(1, "before the move")])
            assert consumer.condition(claim, "Ready")["status"] == "True"
            consumer.wait_condition(claim, "CredentialsCurrent", "True")
            # The claim's status and the Secret's annotation show the change as a new credentials version.
            wait_for(lambda: secret_version() == claim_version() != version_before, 30, "a new version on the claim")
            with psycopg.connect(moved["uri"], autocommit=True) as conn:
                conn.execute("INSERT INTO orders VALUES (2, 'on the target')")

            # Rolled back within the window: the source's endpoint comes back, with the target's writes.
            rest.patch(DATABASE_MOVES, name, {"spec": {"rollback": True}}, stack.namespace)
            wait_for(lambda: reached(name, "RolledBack"), 180, "the rollback", max_interval=0.5)
            assert refused(moved)
            wait_for(lambda: credentials_on(source_port), 60, "the source in the credentials route")
            back = wait_for(
                lambda: secret_with(port=str(source_port)), 60, "the source in the Secret", max_interval=0.5
            )
            assert back == before
            assert serving(back) == (source_port, [(1, "before the move"), (2, "on the target")])
            assert consumer.condition(claim, "Ready")["status"] == "True"
