"""The Consumer controller's typed status write: databaseCount (not yet Deleted) and observedGeneration only."""

from __future__ import annotations

from typing import Any

from reconciler.consumer.controller import ConsumerController

READY = {"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": "2026-11-30T08:00:00Z"}


class Databases:
    def __init__(self, phases: list[str | None]) -> None:
        self.objects = [{"status": {"phase": phase}} if phase else {} for phase in phases]

    def by_index(self, index: str, value: str) -> list[dict[str, Any]]:
        return self.objects if value == "c" else []


class Consumers:
    def __init__(self, consumer: dict[str, Any]) -> None:
        self.consumer = consumer

    def get(self, key: str) -> dict[str, Any] | None:
        return self.consumer if key == "c" else None


class RecordingRest:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def patch(self, resource: Any, name: str, body: dict[str, Any], namespace: str | None = None, **kw: Any) -> Any:
        self.bodies.append(body)
        return {"metadata": {"name": name}}


def test_counts_databases_not_yet_deleted_and_keeps_the_rest_of_the_status() -> None:
    consumer = {
        "metadata": {"name": "c", "generation": 4, "resourceVersion": "9"},
        "status": {"conditions": [READY], "databaseCount": 7, "observedGeneration": 3},
    }
    rest = RecordingRest()
    controller = ConsumerController(rest, Consumers(consumer), Databases(["Ready", "Deleting", "Deleted", None]))  # type: ignore[arg-type]
    assert controller.reconcile("c") is None
    [body] = rest.bodies
    assert body == {"status": {"databaseCount": 3, "observedGeneration": 4}, "metadata": {"resourceVersion": "9"}}
    consumer["status"].update(body["status"])
    controller.reconcile("c")
    assert len(rest.bodies) == 1  # nothing changed: nothing written
