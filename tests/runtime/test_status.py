"""Status writes through the status subresource and condition bookkeeping: a reconcile that
changes nothing writes nothing, a stale read is a 409, lastTransitionTime moves only with status."""

from __future__ import annotations

import copy
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from informers import Rest
from reconciler import runtime
from reconciler.runtime.status import replace_status
from tests.runtime.support import WIDGETS, widget
from tests.support.common import wait_for

# -- conditions (pure) -------------------------------------------------------------------------------

T1, T2, T3, T9 = "2026-12-01T10:00:01Z", "2026-12-01T10:00:02Z", "2026-12-01T10:00:03Z", "2026-12-01T10:00:09Z"


def test_set_condition_adds_a_new_condition() -> None:
    conditions: list[dict] = []
    assert runtime.set_condition(conditions, "Ready", False, "Provisioning", "placed", 3, now=T1)
    assert conditions == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Provisioning",
            "message": "placed",
            "lastTransitionTime": T1,
            "observedGeneration": 3,
        }
    ]


def test_set_condition_keeps_the_transition_time_unless_the_status_changes() -> None:
    conditions: list[dict] = []
    runtime.set_condition(conditions, "Ready", "False", "Provisioning", "placed", 1, now=T1)
    assert runtime.set_condition(conditions, "Ready", "False", "AdminUnavailable", "timeout", 2, now=T2)
    assert runtime.get_condition(conditions, "Ready")["lastTransitionTime"] == T1
    assert runtime.get_condition(conditions, "Ready")["reason"] == "AdminUnavailable"
    assert runtime.get_condition(conditions, "Ready")["observedGeneration"] == 2
    assert runtime.set_condition(conditions, "Ready", True, "Provisioned", "", 2, now=T3)
    assert runtime.get_condition(conditions, "Ready")["lastTransitionTime"] == T3
    assert runtime.is_condition_true(conditions, "Ready")


def test_set_condition_reports_no_change_when_nothing_changed() -> None:
    conditions: list[dict] = []
    runtime.set_condition(conditions, "Ready", True, "Ok", "", 4, now=T1)
    before = copy.deepcopy(conditions)
    assert not runtime.set_condition(conditions, "Ready", "True", "Ok", "", 4, now=T9)
    assert conditions == before


def test_set_condition_rejects_an_invalid_status_and_remove_condition_removes() -> None:
    conditions: list[dict] = []
    with pytest.raises(ValueError):
        runtime.set_condition(conditions, "Ready", "yes", "Ok", "", 1)
    runtime.set_condition(conditions, "Unreachable", True, "Unreachable", "dns", 1)
    assert runtime.remove_condition(conditions, "Unreachable") and conditions == []
    assert not runtime.remove_condition(conditions, "Unreachable")
    assert not runtime.is_condition_true(None, "Ready") and runtime.get_condition(None, "Ready") is None


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
    conditions = status.setdefault("conditions", [])
    runtime.set_condition(conditions, "Ready", ready, reason, "", obj["metadata"]["generation"])
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
    assert ready is not None and runtime.is_condition_true(ready["status"]["conditions"], "Ready")


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
