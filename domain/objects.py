"""Shard, Consumer and Database objects, typed whole: metadata, spec and status parsed in one step.

This is the boundary: an object from the informer cache or the REST client is parsed here once
(`DatabaseObject.parse(obj)`), and the code behind it reads typed fields. A spec that does not validate
raises pydantic.ValidationError, as domain.specs does; so does a status that does not (the callers that
must show such an object anyway choose what to do, e.g. `parse_lenient_status`).

The status is written back from the typed model: `status_body()` gives the camelCase body with only the
fields that were stored or set (see domain.status), in the stored time format, so the body of an unchanged
status equals the stored one and a pass that changes nothing writes nothing; stored keys the model does not
know (a newer release's) are kept. `StatusOf` is the metadata and status alone, for writers that must write
whatever the spec says.

Hot paths that read every Database (the fleet gauges at each scrape) do not parse it: `DatabaseGlance`
reads the few fields they need from the cached dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any, Generic, NamedTuple, Self, TypeVar

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from domain.conditions import with_condition
from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, ConditionStatus, DatabaseConditionType, Phase
from domain.metadata import ObjectMeta
from domain.specs import ConsumerSpec, DatabaseClaimSpec, DatabaseMoveSpec, DatabaseSpec, ShardSpec
from domain.status import (
    ConsumerStatus,
    DatabaseClaimStatus,
    DatabaseMoveStatus,
    DatabaseStatus,
    ObjectStatus,
    ShardStatus,
)
from domain.validation import SpecModel

# A Kubernetes object as JSON, before (or instead of) parsing: the one spelling of that type.
Obj = dict[str, Any]

SpecT = TypeVar("SpecT", bound=BaseModel)
StatusT = TypeVar("StatusT", bound=ObjectStatus)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def status_body(status: BaseModel, stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """`status` as the apiserver stores it (camelCase, only stored or set keys, the stored time format),
    and every key of the `stored` status the model does not know, unchanged.

    Those keys were written by a newer release (whose CRD has them): a writer that dropped them would
    remove them with every merge patch (docs/upgrade.md, mixed versions).
    """
    known = _status_keys(type(status))
    unknown = {key: value for key, value in (stored or {}).items() if key not in known}
    return {**unknown, **status.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")}


@cache
def _status_keys(model: type[BaseModel]) -> frozenset[str]:
    """The camelCase keys a status model reads and writes."""
    return frozenset(field.alias or name for name, field in model.model_fields.items())


class StatusOf(SpecModel, Generic[StatusT]):
    """The metadata and status of one object of ours, the spec left out: what a status writer needs.

    For writers that must write whether or not the spec validates (the Shard controller reports an invalid
    spec in the status; the Consumer controller counts databases). `KubeObject` adds the spec. Change the
    status with `with_status` and `with_condition` (new objects: the models are frozen), write it back
    with `status_body()` (reconciler.runtime.write_status).
    """

    metadata: ObjectMeta
    status: StatusT
    _stored_status: dict[str, Any] = PrivateAttr(default_factory=dict)  # as read: its unknown keys are kept

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """Parse an object from the apiserver or the cache; a missing or null status is an empty one."""
        stored = obj.get("status") or {}
        parsed = cls.model_validate({**obj, "status": stored})
        parsed._stored_status = dict(stored)  # a status that is no mapping did not validate
        return parsed

    @classmethod
    def parse_lenient_status(cls, obj: Mapping[str, Any]) -> tuple[Self, bool]:
        """Like `parse`, but a status that does not validate reads as empty: (object, whether it did).

        For readers that show an object before its status is trusted (the API shows it as not reconciled
        yet), and for writers that replace such a status (its unknown keys are still kept); a spec or
        metadata that does not validate still raises.
        """
        try:
            return cls.parse(obj), True
        except ValidationError as exc:
            if any(error["loc"][:1] != ("status",) for error in exc.errors()):
                raise
        parsed = cls.parse({**obj, "status": {}})
        stored = obj.get("status")
        parsed._stored_status = dict(stored) if isinstance(stored, Mapping) else {}
        return parsed, False

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def key(self) -> str:
        return self.metadata.key

    @property
    def stored_status(self) -> Mapping[str, Any]:
        """The status as read (what a write is diffed against); never change it."""
        return self._stored_status

    def with_status(self, **fields: Any) -> Self:
        """A copy with these status fields set, by their Python names (None removes a field from the stored
        status on the next write)."""
        unknown = fields.keys() - type(self.status).model_fields.keys()
        if unknown:  # model_copy would keep a misspelt key, and the apiserver would prune it silently
            raise TypeError(f"{type(self.status).__name__} has no field {', '.join(sorted(unknown))}")
        return self.model_copy(update={"status": self.status.model_copy(update=fields)})

    def with_condition(
        self, type_: str, status: bool | ConditionStatus, reason: str, message: str, *, now: datetime | None = None
    ) -> Self:
        """A copy with condition `type_` set for this generation (domain.conditions.with_condition); the
        same object when nothing changed."""
        conditions, changed = with_condition(
            self.status.conditions, type_, status, reason, message, self.metadata.generation, now=now or _now()
        )
        return self.with_status(conditions=conditions) if changed else self

    def dump_status(self) -> dict[str, Any]:
        """The status as the apiserver stores it: camelCase, only stored or set keys, the stored time format."""
        return self.status.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")

    def status_body(self) -> dict[str, Any]:
        """`dump_status()` and the stored keys the model does not know: what the status write sends."""
        return status_body(self.status, self._stored_status)


class KubeObject(StatusOf[StatusT], Generic[SpecT, StatusT]):
    """One object of ours as the apiserver returns it (apiVersion and kind are implied by the class)."""

    spec: SpecT


class ShardState(StatusOf[ShardStatus]):
    """A Shard's metadata and status: what the Shard controller writes, also for a Shard whose spec is invalid."""


class ConsumerState(StatusOf[ConsumerStatus]):
    """A Consumer's metadata and status: the Consumer controller counts whatever the spec says."""


# -- cheap typed reads, for hot paths -----------------------------------------------------------------


class DatabaseGlance(NamedTuple):
    """The few fields the fleet gauges read of every Database at each scrape, read without parsing it
    (100,000 pydantic parses per scrape would not do; a tuple is the cheapest to build). A field of the
    wrong type reads as absent."""

    shard: str | None
    phase: str | None
    creation_timestamp: str | None
    conditions: Sequence[Any]  # status.conditions as stored: `is_true` and `reason` read them

    @classmethod
    def of(cls, db: Mapping[str, Any]) -> DatabaseGlance:
        status = _mapping(db.get("status"))
        conditions = status.get("conditions")
        return cls(
            _text(status.get("shard")) or None,
            _text(status.get("phase")) or None,
            _text(_mapping(db.get("metadata")).get("creationTimestamp")) or None,
            conditions if isinstance(conditions, list) else (),
        )

    def _condition(self, type_: str) -> Mapping[str, Any]:
        for condition in self.conditions:
            if isinstance(condition, Mapping) and condition.get("type") == type_:
                return condition
        return {}

    def is_true(self, type_: str) -> bool:
        """Condition `type_` is there with status True."""
        return self._condition(type_).get("status") == ConditionStatus.TRUE

    def reason(self, type_: str) -> str | None:
        """The reason of condition `type_`; None if absent or empty."""
        return _text(self._condition(type_).get("reason")) or None


def cluster_phase(cluster: Mapping[str, Any]) -> str | None:
    """`status.phase` of a Keldon DatabaseCluster (not our kind, no model: the one field the Shard
    controller reads); None when absent."""
    return _text(_mapping(cluster.get("status")).get("phase")) or None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class ShardObject(KubeObject[ShardSpec, ShardStatus]):
    status: ShardStatus = Field(default_factory=ShardStatus)


class ConsumerObject(KubeObject[ConsumerSpec, ConsumerStatus]):
    status: ConsumerStatus = Field(default_factory=ConsumerStatus)


class DatabaseObject(KubeObject[DatabaseSpec, DatabaseStatus]):
    status: DatabaseStatus = Field(default_factory=DatabaseStatus)


class DatabaseMoveObject(KubeObject[DatabaseMoveSpec, DatabaseMoveStatus]):
    """A DatabaseMove as the move controller reads it."""


class ClaimObject(KubeObject[DatabaseClaimSpec, DatabaseClaimStatus]):
    """A DatabaseClaim in a consumer cluster (the agent's kind)."""

    status: DatabaseClaimStatus = Field(default_factory=DatabaseClaimStatus)


# -- cheap accessors and lenient reads -------------------------------------------------------------
# Cheap: for paths that run per request or per object of a large cache, where a whole parse would be
# the cost; each reads one field by its model's alias, typed, without validating the rest.

_DISABLED_KEY = ConsumerSpec.model_fields["disabled"].alias or "disabled"
_SHARD_KEY = DatabaseStatus.model_fields["shard"].alias or "shard"
_TENANT_KEY = DatabaseStatus.model_fields["tenant_name"].alias or "tenantName"


def consumer_disabled(obj: Mapping[str, Any]) -> bool:
    """`spec.disabled` of a Consumer object is true (authentication re-checks it on every request)."""
    spec = obj.get("spec")
    return isinstance(spec, Mapping) and spec.get(_DISABLED_KEY) is True


def database_placement(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(`status.shard`, `status.tenantName`) of a Database object, each None unless a non-empty string."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return None, None
    return _nonempty(status.get(_SHARD_KEY)), _nonempty(status.get(_TENANT_KEY))


_PHASE_KEY = DatabaseStatus.model_fields["phase"].alias or "phase"


def database_ready(obj: Mapping[str, Any]) -> bool:
    """`status.phase` of a Database object is Ready."""
    status = obj.get("status")
    return isinstance(status, Mapping) and status.get(_PHASE_KEY) == Phase.READY.value


def verified_after_failover(obj: Mapping[str, Any]) -> bool:
    """A Database whose tenant is verified once after its shard's primary changed timeline: a Ready one,
    and a soft-deleted one whose tenant is disabled and not yet dropped (reconciler.shard.failover); not
    one whose deletion is held (deleted without the delete annotation: its passes run no SQL)."""
    metadata = _mapping(obj.get("metadata"))
    if metadata.get("deletionTimestamp") and ANNOTATION_DELETE_REQUESTED_AT not in _mapping(
        metadata.get("annotations")
    ):
        return False
    if database_ready(obj):
        return True
    glance = DatabaseGlance.of(obj)
    return glance.phase != Phase.DELETED.value and glance.is_true(DatabaseConditionType.TENANT_DISABLED)


def lenient_status(model: type[StatusT], obj: Mapping[str, Any]) -> StatusT:
    """The typed status of an object, for readers that must show an object whatever its status says (the
    CLI's reports): a field that does not validate reads as unset, the others as stored (one field this
    release would refuse hides nothing else); a missing or malformed status is an empty one."""
    stored = obj.get("status")
    status: Mapping[str, Any] = stored if isinstance(stored, Mapping) else {}
    try:
        return model.model_validate(status)
    except ValidationError as exc:
        refused = {error["loc"][0] for error in exc.errors() if error["loc"]}
    try:
        return model.model_validate({key: value for key, value in status.items() if key not in refused})
    except ValidationError:  # a rule across fields: nothing of it is trusted
        return model.model_validate({})


def _nonempty(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
