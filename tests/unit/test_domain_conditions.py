"""Condition lookup: dicts as the apiserver returns them and typed Conditions answer alike."""

from __future__ import annotations

from datetime import UTC, datetime

from domain.conditions import READY, condition_reason, get_condition, is_condition_true, object_conditions
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
    for conditions in (DICTS, typed_list):
        assert get_condition(conditions, READY) is conditions[1]
        assert condition_reason(conditions, READY) == "NoCapacity"
        assert not is_condition_true(conditions, READY)
        assert is_condition_true(conditions, "DeletionHeld")
        assert get_condition(conditions, "TenantDropped") is None
        assert condition_reason(conditions, "TenantDropped") is None


def test_absent_unknown_and_malformed_are_not_true() -> None:
    assert not is_condition_true(None, READY) and get_condition(None, READY) is None
    assert not is_condition_true([{"type": "Ready", "status": "Unknown", "reason": "Checking"}], READY)
    assert not is_condition_true(["Ready", 7, None], READY)
    assert condition_reason([{"type": "Ready", "status": "True", "reason": ""}], READY) is None


def test_object_conditions_tolerates_missing_or_odd_status() -> None:
    assert object_conditions({"status": {"conditions": DICTS}}) == DICTS
    for obj in (None, {}, {"status": None}, {"status": "x"}, {"status": {"conditions": {"type": "Ready"}}}):
        assert object_conditions(obj) == []
