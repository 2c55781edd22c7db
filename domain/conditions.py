"""Reading Kubernetes-style conditions (`status.conditions`, a list of metav1.Condition).

The controllers, the fleet metrics and the API all ask the same questions of a condition list ("is
Ready True?", "why not?"); they ask them here, so a condition type or status is never matched by a
literal of its own. A condition is a dict as the apiserver returns it, or a typed
`domain.status.Condition`. Writing conditions stays with the controllers (reconciler.runtime.status).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

from domain.constants import ConditionStatus

# The condition type every kind of ours carries (Shard, Consumer, Database): the object's summary.
READY: Final = "Ready"

C = TypeVar("C")


def _field(condition: object, name: str) -> Any:
    """A field of a condition dict (camelCase keys) or of a typed Condition (the same names here)."""
    if isinstance(condition, Mapping):
        return condition.get(name)
    return getattr(condition, name, None)


def get_condition(conditions: Iterable[C] | None, type_: str) -> C | None:
    """The condition of type `type_` in `conditions` (the first one), or None."""
    for condition in conditions or ():
        if _field(condition, "type") == type_:
            return condition
    return None


def is_condition_true(conditions: Iterable[Any] | None, type_: str) -> bool:
    """True only if condition `type_` is present with status True (absent or Unknown is not True)."""
    condition = get_condition(conditions, type_)
    return condition is not None and _field(condition, "status") == ConditionStatus.TRUE


def condition_reason(conditions: Iterable[Any] | None, type_: str) -> str | None:
    """The reason of condition `type_` now (a value, not the dict a writer may change); None if absent or empty."""
    condition = get_condition(conditions, type_)
    reason = None if condition is None else _field(condition, "reason")
    return reason if isinstance(reason, str) and reason else None


def object_conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """`status.conditions` of an object as the apiserver returns it ([] when absent or malformed)."""
    status = (obj or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return conditions if isinstance(conditions, list) else []
