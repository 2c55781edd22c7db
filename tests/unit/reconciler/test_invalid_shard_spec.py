"""A Shard whose spec does not validate: reported Unreachable by its controller, never a placement.

The apiserver refuses such a spec through the generated CRD schema, so the real-apiserver suites cannot
create one; an older CRD (or a schema change in flight) could still serve one. The controller is fed
a cached object and writes through a recording client.
"""

from __future__ import annotations

from typing import Any

from domain.resources import database_shard
from reconciler.placement_index import PlacementIndex
from reconciler.shard.controller import NOT_READY_RECHECK, ShardController
from tests.vectors.objects import SHARD_SPEC, with_changes

READY = {"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": "2026-11-30T08:00:00Z"}
BROKEN = {
    "metadata": {"name": "broken", "generation": 3, "resourceVersion": "7"},
    "spec": {"maxDatabases": 5, "perconaCluster": {"namespace": "pg", "name": "broken"}},  # no admin, no client
    "status": {"conditions": [READY], "connectionBudget": 100},
}


class Cache:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objects.get(key)

    def __len__(self) -> int:
        return len(self.objects)

    def count_by_index(self, index: str, value: str) -> int:
        return 0

    def by_index(self, index: str, value: str) -> list[dict[str, Any]]:
        return []


class RecordingRest:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any], str | None]] = []

    def patch(self, resource: Any, name: str, body: dict[str, Any], namespace: str | None = None, **kw: Any) -> Any:
        self.patches.append((name, body, kw.get("subresource")))
        return {"metadata": {"name": name}}


def test_the_shard_controller_reports_it_unreachable_without_connecting() -> None:
    rest = RecordingRest()
    controller = ShardController(rest, Cache(BROKEN), Cache())  # type: ignore[arg-type]
    result = controller.reconcile("broken")
    assert result is not None and result.requeue_after == NOT_READY_RECHECK
    [(name, body, subresource)] = rest.patches
    assert (name, subresource) == ("broken", "status")
    conditions = {c["type"]: c for c in body["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "Unreachable")
    assert conditions["Ready"]["message"] == "the Shard's spec is invalid: admin: is required; client: is required"
    assert conditions["Unreachable"]["status"] == "True"
    assert conditions["AdminAuthFailed"]["status"] == "False"


def test_placement_never_offers_it_even_while_its_status_says_ready() -> None:
    index = PlacementIndex(database_shard)
    index.shard_event("ADDED", None, BROKEN)
    assert index.choose("postgres") is None
    assert index.not_ready("postgres") == []


def test_the_message_names_a_client_ca_that_is_no_certificate() -> None:
    garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"  # passes the CRD's pattern
    shard = {**BROKEN, "spec": with_changes(SHARD_SPEC, client__caCert=garbage)}
    rest = RecordingRest()
    ShardController(rest, Cache(shard), Cache()).reconcile("broken")  # type: ignore[arg-type]
    [(_, body, _)] = rest.patches
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "the Shard's spec is invalid: client.caCert: holds a CERTIFICATE block that is not a valid X.509 certificate"
    )
