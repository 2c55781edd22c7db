"""Conditions: typed ones change with lastTransitionTime moving only with the status; the dict readers (for
kinds that are not ours) answer like the typed ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain.conditions import (
    READY,
    condition_is_true,
    condition_reason,
    find_condition,
    get_condition,
    is_condition_true,
    object_conditions,
    with_condition,
    without_condition,
)
from domain.constants import ConditionStatus
from domain.status import Condition

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
DICTS = [
    {"type": "DeletionHeld", "status": "True", "reason": "Held"},
    {"type": "Ready", "status": "False", "reason": "NoCapacity"},
]


def typed(type_: str, status: str, reason: str) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message="", last_transition_time=NOW)


def test_lookup_by_type_in_dicts_and_typed_conditions() -> None:
    typed_list = (typed("DeletionHeld", "True", "Held"), typed("Ready", "False", "NoCapacity"))
    assert get_condition(DICTS, READY) is DICTS[1] and find_condition(typed_list, READY) is typed_list[1]
    assert condition_reason(typed_list, READY) == "NoCapacity"
    assert not is_condition_true(DICTS, READY) and not condition_is_true(typed_list, READY)
    assert is_condition_true(DICTS, "DeletionHeld") and condition_is_true(typed_list, "DeletionHeld")
    assert get_condition(DICTS, "TenantDropped") is None and find_condition(typed_list, "TenantDropped") is None
    assert condition_reason(typed_list, "TenantDropped") is None


def test_absent_unknown_and_malformed_are_not_true() -> None:
    assert not is_condition_true(None, READY) and get_condition(None, READY) is None
    assert not is_condition_true([{"type": "Ready", "status": "Unknown", "reason": "Checking"}], READY)
    assert not is_condition_true(["Ready", 7, None], READY)


def test_object_conditions_tolerates_missing_or_odd_status() -> None:
    assert object_conditions({"status": {"conditions": DICTS}}) == DICTS
    for obj in (None, {}, {"status": None}, {"status": "x"}, {"status": {"conditions": {"type": "Ready"}}}):
        assert object_conditions(obj) == []


def test_a_new_condition_is_appended_with_this_moment() -> None:
    conditions, changed = with_condition((), READY, False, "Provisioning", "placed", 3, now=NOW)
    assert changed and [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Provisioning",
            "message": "placed",
            "lastTransitionTime": "2026-11-30T08:00:00Z",
            "observedGeneration": 3,
        }
    ]


def test_the_transition_time_moves_only_with_the_status() -> None:
    later, latest = NOW + timedelta(seconds=1), NOW + timedelta(seconds=2)
    conditions, _ = with_condition((), READY, False, "Provisioning", "placed", 1, now=NOW)
    conditions, changed = with_condition(conditions, READY, False, "AdminUnavailable", "timeout", 2, now=later)
    ready = find_condition(conditions, READY)
    assert changed and ready is not None
    assert (ready.last_transition_time, ready.reason, ready.observed_generation) == (NOW, "AdminUnavailable", 2)
    conditions, changed = with_condition(conditions, READY, ConditionStatus.TRUE, "Provisioned", "", 2, now=latest)
    ready = find_condition(conditions, READY)
    assert changed and ready is not None and ready.last_transition_time == latest
    assert condition_is_true(conditions, READY)


def test_nothing_changed_is_said_and_a_removed_condition_is_gone() -> None:
    conditions, _ = with_condition((), "Unreachable", True, "Unreachable", "dns", 4, now=NOW)
    same, changed = with_condition(conditions, "Unreachable", True, "Unreachable", "dns", 4, now=NOW + timedelta(9))
    assert not changed and same == conditions
    assert without_condition(conditions, "Unreachable") == ((), True)
    assert without_condition((), "Unreachable") == ((), False)
