"""The agent end to end: a DatabaseClaim in the consumer cluster becomes a database at the real provider
and a Secret whose credentials log in to PostgreSQL; a rotation and a new client endpoint of the shard
reach the Secret; the provider away keeps the Secret; deleting the claim starts the provider's soft
delete (Delete) or leaves everything (Orphan)."""

from __future__ import annotations

import base64
from typing import Any

import psycopg
import requests

from dbprovider.devstack import DevStack
from domain.naming import alternate_name, claim_database_id
from domain.resources import CLAIMS, SHARDS
from harness import KubeControlPlane
from informers import EVENTS, Rest
from tests.agent.conftest import Consumer, Provider
from tests.support.common import unique, wait_for

BINDING_KEYS = {"type", "provider", "host", "port", "database", "username", "password", "uri", "sslmode"}


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def logs_in(values: dict[str, str]) -> str:
    """Connect with the Secret's URI (as a workload would) and return current_user."""
    with psycopg.connect(values["uri"], connect_timeout=10) as conn:
        row = conn.execute("SELECT current_user").fetchone()
    assert row is not None
    return str(row[0])


def provider_get(stack: DevStack, path: str) -> dict[str, Any]:
    """A GET of the provider's API as the consumer, which must answer 200."""
    response = requests.get(
        f"{stack.api_url}{path}",
        headers={"Authorization": f"Bearer {stack.token}"},
        verify=str(stack.ca_file),
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def provider_view(stack: DevStack, external_id: str) -> dict[str, Any]:
    return provider_get(stack, f"/v1/databases/{external_id}")


def provider_databases(stack: DevStack) -> list[dict[str, Any]]:
    """The consumer's databases as the provider lists them."""
    return list(provider_get(stack, "/v1/databases")["items"])


def no_delete_pending(stack: DevStack) -> None:
    """Wait until earlier tests' deletes are dropped (a drop changes the list, and frees a quota slot)."""
    wait_for(lambda: not any(db["deleteRequestedAt"] for db in provider_databases(stack)), 120, "pending drops")


def ready_claim(consumer: Consumer, spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """A new claim, once Ready, and its Secret's values."""
    claim = consumer.claim(unique("team"), spec)
    consumer.wait_condition(claim, "Ready", "True", timeout=120)
    meta = claim["metadata"]
    secret = consumer.secret(meta["namespace"], (spec or {}).get("secretName", meta["name"]))
    assert secret is not None
    return claim, decoded(secret)


def test_a_claim_becomes_a_secret_that_logs_in(consumer: Consumer, stack: DevStack) -> None:
    claim, values = ready_claim(consumer)
    meta = claim["metadata"]
    status = (consumer.get_claim(claim) or {})["status"]
    db_id = claim_database_id(meta["namespace"], meta["name"])
    assert status["databaseId"] == db_id
    assert status["phase"] == "Ready"
    assert status["binding"] == {"name": meta["name"]}
    assert consumer.condition(claim, "ProviderReachable")["status"] == "True"
    assert consumer.condition(claim, "CredentialsCurrent")["status"] == "True"

    secret = consumer.secret(meta["namespace"], meta["name"])
    assert secret is not None
    assert secret["type"] == "servicebinding.io/postgresql"
    assert BINDING_KEYS <= set(values)
    assert values["type"] == "postgresql" and values["provider"] == "dbprovider"
    owners = secret["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("DatabaseClaim", meta["uid"], True)]
    assert logs_in(values) == values["username"]
    assert provider_view(stack, db_id)["phase"] == "Ready"
    assert "password" not in str(status) and values["password"] not in str(status)
    events = consumer.admin.list(EVENTS, meta["namespace"])["items"]
    recorded = {e["reason"] for e in events if e["involvedObject"]["uid"] == meta["uid"]}
    assert {"Created", "SecretWritten"} <= recorded
    assert not any(values["password"] in e["message"] for e in events)


def _rotate_claim(consumer: Consumer, claim: dict[str, Any], before: dict[str, str]) -> dict[str, str]:
    """Ask for a rotation on the claim; the Secret's values once they hold the new password."""
    meta = claim["metadata"]
    consumer.admin.patch(
        CLAIMS, meta["name"], {"metadata": {"annotations": {"db.bnerd.com/rotate": "1"}}}, meta["namespace"]
    )

    def rotated() -> dict[str, str] | None:
        secret = consumer.secret(meta["namespace"], meta["name"])
        values = decoded(secret) if secret else {}
        return values if values.get("password") not in (None, before["password"]) else None

    return wait_for(rotated, 120, "the new password in the Secret", max_interval=0.5)


def session_user(values: dict[str, str]) -> str:
    with psycopg.connect(values["uri"], connect_timeout=10) as conn:
        row = conn.execute("SELECT session_user").fetchone()
    assert row is not None
    return str(row[0])


def refused(values: dict[str, str]) -> bool:
    try:
        psycopg.connect(values["uri"], connect_timeout=10).close()
    except psycopg.OperationalError:
        return True
    return False


def test_a_rotation_asked_on_the_claim_keeps_the_old_credentials_for_the_overlap(consumer: Consumer) -> None:
    claim, before = ready_claim(consumer, {"rotation": {"overlap": "20s"}})

    after = _rotate_claim(consumer, claim, before)

    # The new username and password came together, and log in at once; the workload's old ones still do.
    assert after["username"] == alternate_name(before["username"]) and after["username"] in after["uri"]
    assert session_user(after) == after["username"]
    assert logs_in(after) == before["username"]  # its sessions act as the database's owner role
    assert session_user(before) == before["username"]
    status = (consumer.get_claim(claim) or {})["status"]
    assert status["rotationRequested"] == "1"
    consumer.wait_condition(claim, "CredentialsCurrent", "True")
    # Once the overlap is over the old ones are refused; the new ones keep working.
    wait_for(lambda: refused(before), 120, "the old credentials refused")
    assert session_user(after) == after["username"]


def test_a_rotation_without_overlap_keeps_the_username(consumer: Consumer) -> None:
    claim, before = ready_claim(consumer, {"rotation": {"overlap": "0s"}})

    after = _rotate_claim(consumer, claim, before)

    assert after["username"] == before["username"]
    assert logs_in(after) == before["username"]
    assert refused(before)


def test_the_provider_away_keeps_the_secret(consumer: Consumer, provider: Provider) -> None:
    claim, before = ready_claim(consumer)
    meta = claim["metadata"]
    provider.kill()
    try:
        away = consumer.wait_condition(claim, "ProviderReachable", "False", timeout=60)
        assert away["reason"] == "ProviderUnavailable"
        secret = consumer.secret(meta["namespace"], meta["name"])
        assert secret is not None and decoded(secret) == before
        assert consumer.condition(claim, "Ready")["status"] == "True"  # the Secret still works
        assert logs_in(before) == before["username"]
    finally:
        provider.start()
    consumer.wait_condition(claim, "ProviderReachable", "True", timeout=60)
    secret = consumer.secret(meta["namespace"], meta["name"])
    assert secret is not None and decoded(secret) == before


def test_deleting_a_claim_starts_the_soft_delete_and_removes_the_secret(consumer: Consumer, stack: DevStack) -> None:
    claim, _ = ready_claim(consumer)
    meta = claim["metadata"]
    db_id = claim_database_id(meta["namespace"], meta["name"])
    consumer.admin.delete(CLAIMS, meta["name"], meta["namespace"])
    wait_for(lambda: consumer.get_claim(claim) is None, 60, "the claim gone", max_interval=0.5)
    assert consumer.secret(meta["namespace"], meta["name"]) is None

    def delete_requested() -> dict[str, Any] | None:
        # The provider answers GETs from its cache, which may show the delete a moment after it accepted it.
        view = provider_view(stack, db_id)
        return view if view["deleteRequestedAt"] is not None else None

    view = wait_for(delete_requested, 30, "deleteRequestedAt at the provider", max_interval=0.5)
    assert view["dropAfter"] is not None


def test_an_orphan_claim_leaves_the_database_and_the_secret(consumer: Consumer, stack: DevStack) -> None:
    claim, values = ready_claim(consumer, {"deletionPolicy": "Orphan", "secretName": "pg-orphan"})
    meta = claim["metadata"]
    consumer.admin.delete(CLAIMS, meta["name"], meta["namespace"])
    wait_for(lambda: consumer.get_claim(claim) is None, 60, "the claim gone", max_interval=0.5)
    secret = consumer.secret(meta["namespace"], "pg-orphan")
    assert secret is not None and not secret["metadata"].get("ownerReferences")
    assert decoded(secret) == values
    view = provider_view(stack, claim_database_id(meta["namespace"], meta["name"]))
    assert view["phase"] == "Ready" and view["deleteRequestedAt"] is None
    assert logs_in(values) == values["username"]


def test_a_new_client_endpoint_reaches_the_secret(consumer: Consumer, stack: DevStack, kube: KubeControlPlane) -> None:
    claim, before = ready_claim(consumer)
    meta = claim["metadata"]

    def secret_host(host: str) -> dict[str, str] | None:
        secret = consumer.secret(meta["namespace"], meta["name"])
        values = decoded(secret) if secret else {}
        return values if values.get("host") == host else None

    with kube.admin_client() as client:
        shards = Rest(client)
        shards.patch(SHARDS, stack.shard, {"spec": {"client": {"host": "localhost"}}})
        try:
            moved = wait_for(lambda: secret_host("localhost"), 120, "the new host in the Secret", max_interval=0.5)
            assert moved["password"] == before["password"] and "@localhost:" in moved["uri"]
        finally:
            shards.patch(SHARDS, stack.shard, {"spec": {"client": {"host": "127.0.0.1"}}})
    back = wait_for(lambda: secret_host("127.0.0.1"), 120, "the host back in the Secret", max_interval=0.5)
    assert logs_in(back) == before["username"]
