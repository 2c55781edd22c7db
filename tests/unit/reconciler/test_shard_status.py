"""The Shard controller's status, built typed from the parsed Shard: a check that finds what the last one
found writes nothing, and status keys a newer release wrote stay."""

from __future__ import annotations

from typing import Any

from domain.constants import ShardReason
from domain.objects import ShardState
from reconciler.runtime import merge_patch
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
