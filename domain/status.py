"""Typed `status` of the Shard, Consumer and Database objects: what the reconciler writes.

The CRDs' status schemas are generated from these models (infra.crds), exactly like the spec schemas from
domain.specs: a field the reconciler writes must exist here, or the apiserver prunes it on the status
update. Adding a field here adds it to the CRD on the next render / `pulumi up`.

Write status through the status subresource with camelCase keys, e.g.
`DatabaseStatus(...).model_dump(by_alias=True, exclude_none=True, mode="json")`. Every field is optional
so a partial status (an object seen for the first time) is valid; `observedGeneration` says which spec
generation the rest of the status describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated

from pydantic import Field, PlainSerializer, StrictInt, StrictStr

from domain.constants import SIZE_CLASS_MAX_LENGTH, ConditionStatus, Phase
from domain.timefmt import format_time
from domain.validation import ObjectName, SpecModel

# metav1.Condition's own limits, so generic tooling (kubectl wait, kstatus) reads our conditions.
CONDITION_TYPE_RE = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_RE = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_MESSAGE_MAX_LENGTH = 32768

Generation = Annotated[StrictInt, Field(ge=0)]

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


class ShardStatus(SpecModel):
    """Observed state of a Shard, written by the Shard controller (periodic admin check every 60 s)."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation the conditions were computed for."
    )
    conditions: Conditions = ()
    database_count: Annotated[StrictInt, Field(ge=0)] | None = Field(
        default=None,
        description="Database objects placed on this shard (every phase, until the object is gone). While "
        "above 0, deleting the Shard is refused by the deletion-protection admission policy.",
    )
    server_version: Annotated[StrictStr, Field(max_length=64)] | None = Field(
        default=None,
        description="Server version seen on the admin connection (e.g. 16.4); below 16 the older grant "
        "dialect is used and role isolation is weaker (condition WeakRoleIsolation).",
    )
    connection_budget: Annotated[StrictInt, Field(ge=0)] | None = Field(
        default=None,
        description="Connections the tenants' CONNECTION LIMITs may add up to on this shard: the server's "
        "max_connections minus its superuser and reserved slots, the provider's own sessions and the "
        "install's connectionBudget.reserved (read at each check). A database is placed only where its "
        "limit fits.",
    )
    connections_committed: Annotated[StrictInt, Field(ge=0)] | None = Field(
        default=None,
        description="The connection limits of the databases placed here (an unlimited one counts as the whole "
        "budget); above connectionBudget: condition ConnectionBudgetExceeded.",
    )


class ConsumerStatus(SpecModel):
    """Observed state of a Consumer."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    conditions: Conditions = ()
    database_count: Annotated[StrictInt, Field(ge=0)] | None = Field(
        default=None,
        description="This consumer's databases that are not yet Deleted (Deleting ones count): the number "
        "compared with spec.maxDatabases.",
    )


class DatabaseStatus(SpecModel):
    """Observed state of a Database; placement and tenant name are written once, before any SQL."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    phase: Phase | None = Field(default=None, description="Provisioning, Ready, Deleting, Deleted or Failed.")
    shard: ObjectName | None = Field(
        default=None,
        description="The Shard this database is placed on; persisted before any SQL runs and never changed.",
    )
    tenant_name: Annotated[StrictStr, Field(max_length=63, pattern="^[a-z_][a-z0-9_]*$")] | None = Field(
        default=None,
        description="Name of the role and of the database on the shard; chosen once, before any SQL, and "
        "never changed.",
    )
    applied_size_class: Annotated[StrictStr, Field(max_length=SIZE_CLASS_MAX_LENGTH)] | None = Field(
        default=None,
        description="The spec.sizeClass whose connection limit is applied (empty: connectionLimit.default).",
    )
    applied_connection_limit: Annotated[StrictInt, Field(ge=-1)] | None = Field(
        default=None,
        description="CONNECTION LIMIT set on the tenant role (-1 = unlimited); compared with the install "
        "config to report ConnectionLimitDrift.",
    )
    drop_after: StatusTime | None = Field(
        default=None,
        description="While Deleting: the earliest time the tenant is dropped (delete request + "
        "softDelete.retention). Removing the delete annotation before then recovers the database.",
    )
    conditions: Conditions = ()
    password_applied: Annotated[StrictStr, Field(max_length=64)] | None = Field(
        default=None,
        description="The db.bnerd.com/password-id of the credentials Secret whose password is set on the "
        "tenant role; a different id in the Secret means a new password is pending.",
    )
    rotation_applied: Annotated[StrictStr, Field(max_length=64)] | None = Field(
        default=None,
        description="The value of the rotate-requested-at annotation whose new password is in effect; a "
        "different annotation value asks the reconciler for a new password.",
    )


# -- typed conditions ------------------------------------------------------------------------------
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
