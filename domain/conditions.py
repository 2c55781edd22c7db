"""Kubernetes-style conditions (`status.conditions`, a list of metav1.Condition): the one API.

Typed: `Condition` is the frozen model every status of ours carries (domain.status: `conditions: Conditions`).
Read with `find_condition`, `condition_is_true` and `condition_reason`; change with `with_condition` and
`without_condition`, which return a new tuple and whether anything changed (lastTransitionTime moves only
with the status). The controllers, the fleet metrics and the API ask these questions here, so a condition
type or status is never matched by a literal of its own.

Our own kinds are parsed (domain.objects) and their conditions are these models; a writer changes them
on the parsed object (`StatusOf.with_condition`) and writes the status back from it. Only objects that
are not ours and have no model (a CRD's Established condition, dbprovider.kubeapply) are read as dicts,
with `object_conditions`, `get_condition` and `is_condition_true`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import Field, PlainSerializer, StrictStr

from domain.constants import ConditionStatus
from domain.timefmt import format_time
from domain.validation import Count, SpecModel

# The condition type every kind of ours carries (Shard, Consumer, Database): the object's summary.
READY: Final = "Ready"

# metav1.Condition's own limits, so generic tooling (kubectl wait, kstatus) reads our conditions.
CONDITION_TYPE_RE = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_RE = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_MESSAGE_MAX_LENGTH = 32768

Generation = Count
"""A metadata.generation: the apiserver numbers each version of the spec (1 at creation, +1 per change)."""

# UTC, whole seconds, `Z` (domain.timefmt): the one format status timestamps are stored in, so re-dumping
# an unchanged status gives back exactly what is stored (and a pass that changes nothing writes nothing).
StatusTime = Annotated[datetime, PlainSerializer(format_time, return_type=str, when_used="json")]


class Condition(SpecModel):
    """One observation about the object (the shape of metav1.Condition)."""

    type: Annotated[StrictStr, Field(max_length=316, pattern=CONDITION_TYPE_RE)] = Field(
        description="Condition type, e.g. Ready, DeletionHeld, ConnectionLimitDrift, AdminAuthFailed."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this condition was computed for."
    )
    last_transition_time: StatusTime = Field(description="When the status last changed (not when it was last checked).")
    reason: Annotated[StrictStr, Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_RE)] = Field(
        description="Machine-readable CamelCase reason, e.g. Ok, Unreachable, NoCapacity, Provisioned."
    )
    message: Annotated[StrictStr, Field(max_length=CONDITION_MESSAGE_MAX_LENGTH)] = Field(
        description="Human-readable detail; a sanitized error class at most, never driver text or credentials."
    )


Conditions = Annotated[
    tuple[Condition, ...],
    Field(
        description="Current conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    ),
]


# -- reading and changing typed conditions --------------------------------------------------------
# The models are frozen: these return a new tuple (and whether anything changed) instead of mutating.


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """Condition `type_`, or None."""
    return next((c for c in conditions if c.type == type_), None)


def condition_is_true(conditions: Sequence[Condition], type_: str) -> bool:
    found = find_condition(conditions, type_)
    return found is not None and found.status == ConditionStatus.TRUE


def with_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None,
    *,
    now: datetime,
) -> tuple[tuple[Condition, ...], bool]:
    """`conditions` with `type_` set (in its place, or appended), and whether anything changed.

    lastTransitionTime changes only when the status changes (or the condition is new); reason,
    message and observedGeneration (when given) are updated without touching it.
    """
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    current = find_condition(conditions, type_)
    if current is None:
        new = Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=now,
            **({} if observed_generation is None else {"observed_generation": observed_generation}),
        )
        return (*conditions, new), True
    update: dict[str, object] = {}
    if current.status != status:
        update.update(status=status, last_transition_time=now)
    if current.reason != reason:
        update["reason"] = reason
    if current.message != message:
        update["message"] = message
    if observed_generation is not None and current.observed_generation != observed_generation:
        update["observed_generation"] = observed_generation
    if not update:
        return tuple(conditions), False
    changed = Condition.model_validate({**current.model_dump(exclude_unset=True), **update})
    return tuple(changed if c is current else c for c in conditions), True


def without_condition(conditions: Sequence[Condition], type_: str) -> tuple[tuple[Condition, ...], bool]:
    """`conditions` without `type_`, and whether it was there."""
    kept = tuple(c for c in conditions if c.type != type_)
    return kept, len(kept) != len(conditions)


def condition_reason(conditions: Sequence[Condition], type_: str) -> str | None:
    """The reason of condition `type_`; None if absent or empty."""
    found = find_condition(conditions, type_)
    return found.reason if found is not None and found.reason else None


# -- readers of raw condition dicts: kinds that are not ours and have no model -------------------------


def get_condition(conditions: Iterable[Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition dict of type `type_` in `conditions` (the first one), or None."""
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            return condition
    return None


def is_condition_true(conditions: Iterable[Any] | None, type_: str) -> bool:
    """True only if condition `type_` is present with status True (absent or Unknown is not True)."""
    condition = get_condition(conditions, type_)
    return condition is not None and condition.get("status") == ConditionStatus.TRUE


def object_conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """`status.conditions` of an object as the apiserver returns it ([] when absent or malformed)."""
    status = (obj or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return conditions if isinstance(conditions, list) else []
