"""Status writes through the status subresource: a reconcile that changes nothing writes nothing, and a
stale read is a 409 (conditions: tests/unit/domain/test_conditions.py)."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime

import pytest
from kubernetes.client.exceptions import ApiException

from domain.conditions import Condition, is_condition_true, with_condition
from informers import Rest
from reconciler import runtime
from reconciler.runtime.status import replace_status
from tests.runtime.support import WIDGETS, widget
from tests.support.common import wait_for

# -- merge patches (pure) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"n": {"x": 1, "y": 2}}, {"n": {"x": 1, "y": 3}}, {"n": {"y": 3}}),
        ({"l": [1, 2]}, {"l": [1, 2, 3]}, {"l": [1, 2, 3]}),
        ({}, {"n": {"x": 1}}, {"n": {"x": 1}}),
    ],
    ids=["equal", "scalar", "removed", "nested", "list-whole", "new-object"],
)
def test_merge_patch_is_the_minimal_rfc7386_difference(old: dict, new: dict, patch: dict) -> None:
    assert runtime.merge_patch(old, new) == patch


# -- writing through the status subresource ------------------------------------------------------------


@pytest.fixture
def created(admin_rest: Rest, namespace: str, widgets_crd: None) -> dict:
    return admin_rest.create(WIDGETS, widget("w", namespace, {"size": "small"}))


def _desired(obj: dict, ready: bool, reason: str) -> dict:
    status = copy.deepcopy(obj.get("status") or {})
    current = tuple(Condition.model_validate(c) for c in status.get("conditions", []))
    generation = obj["metadata"]["generation"]
    conditions, _ = with_condition(current, "Ready", ready, reason, "", generation, now=datetime.now(UTC))
    status["conditions"] = [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions]
    status["phase"] = "Ready" if ready else "Provisioning"
    return status


def test_update_status_writes_the_difference_and_nothing_when_unchanged(admin_rest: Rest, created: dict) -> None:
    written = runtime.update_status(admin_rest, WIDGETS, created, _desired(created, False, "Provisioning"))
    assert written is not None and written["status"]["phase"] == "Provisioning"
    assert written["spec"] == {"size": "small"}
    rv = written["metadata"]["resourceVersion"]

    assert runtime.update_status(admin_rest, WIDGETS, written, _desired(written, False, "Provisioning")) is None
    assert admin_rest.get(WIDGETS, "w", created["metadata"]["namespace"])["metadata"]["resourceVersion"] == rv

    ready = runtime.update_status(admin_rest, WIDGETS, written, _desired(written, True, "Provisioned"))
    assert ready is not None and is_condition_true(ready["status"]["conditions"], "Ready")


def test_a_status_write_from_a_stale_read_is_a_conflict(admin_rest: Rest, created: dict) -> None:
    namespace = created["metadata"]["namespace"]
    admin_rest.patch(WIDGETS, "w", {"status": {"note": "someone else"}}, namespace, subresource="status")
    with pytest.raises(ApiException) as caught:
        runtime.update_status(admin_rest, WIDGETS, created, _desired(created, True, "Provisioned"))
    assert caught.value.status == 409
    # Unconditional writes are possible on purpose (fields nobody else writes).
    runtime.patch_status(admin_rest, WIDGETS, "w", {"phase": "Ready"}, namespace=namespace, resource_version=None)
    assert admin_rest.get(WIDGETS, "w", namespace)["status"] == {"note": "someone else", "phase": "Ready"}


def test_the_status_subresource_never_writes_spec(admin_rest: Rest, created: dict) -> None:
    obj = copy.deepcopy(created)
    obj["spec"] = {"size": "huge"}
    obj["status"] = {"phase": "Ready"}
    written = replace_status(admin_rest, WIDGETS, obj)
    assert written["spec"] == {"size": "small"} and written["status"] == {"phase": "Ready"}


def test_a_stopping_controller_does_not_write_status(admin_rest: Rest, created: dict) -> None:
    namespace = created["metadata"]["namespace"]
    entered, release = threading.Event(), threading.Event()

    def reconcile(key: str) -> runtime.Result:
        entered.set()
        release.wait(10)
        runtime.update_status(admin_rest, WIDGETS, created, {"phase": "Ready"})
        return runtime.Result()

    controller = runtime.Controller("status-writer", reconcile, metrics=runtime.RuntimeMetrics())
    controller.start()
    controller.enqueue(f"{namespace}/w")
    assert entered.wait(5)
    controller.signal_stop()
    release.set()
    assert controller.stop(timeout=5)
    assert "status" not in admin_rest.get(WIDGETS, "w", namespace)
    wait_for(lambda: not controller.running)
