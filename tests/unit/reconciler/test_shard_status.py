"""The Shard controller's status, built typed from the parsed Shard: a check that finds what the last one
found writes nothing, and status keys a newer release wrote stay."""

from __future__ import annotations

from typing import Any

from domain.constants import ShardReason
from domain.objects import ShardState
from reconciler.runtime import merge_patch
from reconciler.shard.client_logins import report_client_logins
from reconciler.shard.controller import Health, observe

OK = Health(ShardReason.OK, "admin connection healthy", server_version="17.2")


def shard(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "shard-a", "generation": 2, "resourceVersion": "9"}, "spec": {}, "status": status}


def checked(status: dict[str, Any] | None, health: Health, count: int = 3) -> dict[str, Any]:
    """The status body one check writes, starting from `status` as stored."""
    return observe(ShardState.parse(shard(status)), health, count, cloudberry=False).status_body()


def test_a_check_that_finds_the_same_writes_nothing() -> None:
    first = checked(None, OK)
    assert first["databaseCount"] == 3 and first["observedGeneration"] == 2 and first["serverVersion"] == "17.2"
    assert [c["type"] for c in first["conditions"]] == ["Ready", "AdminAuthFailed", "Unreachable", "WeakRoleIsolation"]
    assert merge_patch(first, checked(first, OK)) == {}


def test_a_failed_check_changes_only_what_it_found_and_keeps_the_last_server_version() -> None:
    first = checked(None, OK)
    down = checked(first, Health(ShardReason.UNREACHABLE, "unreachable: timeout"))
    patch = merge_patch(first, down)
    assert set(patch) == {"conditions"} and down["serverVersion"] == "17.2"
    ready = next(c for c in down["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unreachable")


def test_a_newer_releases_status_keys_are_kept() -> None:
    stored = {**checked(None, OK), "replicaLag": "2s"}
    assert merge_patch(stored, checked(stored, OK, count=4)) == {"databaseCount": 4}


def database(phase: str, reason: str, message: str = "") -> dict[str, Any]:
    ready = {"type": "Ready", "status": "False", "reason": reason, "message": message}
    return {"status": {"phase": phase, "conditions": [ready]}}


def client_logins(status: dict[str, Any] | None, databases: list[dict[str, Any]]) -> dict[str, Any]:
    return report_client_logins(ShardState.parse(shard(status)), databases).status_body()


def test_client_login_failing_appears_with_the_first_database_that_cannot_log_in_and_clears() -> None:
    """Absent on a shard whose databases log in; True with the count and the first one's message while
    new databases wait on LoginFailed; False (kept) once none waits."""
    fine = checked(None, OK)
    assert client_logins(fine, [database("Ready", "Provisioned")]) == fine
    refused = "login failed: auth_failed: a new session as the tenant at 127.0.0.1:6432 (client endpoint) ..."
    waiting = [database("Provisioning", "LoginFailed", refused), database("Provisioning", "LoginFailed", refused)]
    failing = client_logins(fine, [*waiting, database("Provisioning", "EnsureFailed")])
    condition = next(c for c in failing["conditions"] if c["type"] == "ClientLoginFailing")
    assert (condition["status"], condition["reason"]) == ("True", "LoginFailed")
    assert condition["message"].startswith("2 new database(s)") and refused in condition["message"]
    cleared = client_logins(failing, [database("Ready", "Provisioned")])
    condition = next(c for c in cleared["conditions"] if c["type"] == "ClientLoginFailing")
    assert (condition["status"], condition["reason"]) == ("False", "Ok")
