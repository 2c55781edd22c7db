"""Shard, Consumer and Database objects, typed whole: metadata, spec and status parsed in one step.

This is the boundary: an object from the informer cache or the REST client is parsed here once
(`DatabaseObject.parse(obj)`), and the code behind it reads typed fields. A spec that does not validate
raises pydantic.ValidationError, as domain.specs does; so does a status that does not (the callers that
must show such an object anyway choose what to do, e.g. `parse_lenient_status`).

The status is written back from the typed model: `dump_status()` gives the camelCase body with only the
fields that were stored or set (see domain.status), for the status merge patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Self, TypeVar

from pydantic import BaseModel, Field, ValidationError

from domain.metadata import ObjectMeta
from domain.specs import ConsumerSpec, DatabaseSpec, ShardSpec
from domain.status import ConsumerStatus, DatabaseStatus, ShardStatus
from domain.validation import SpecModel

# A Kubernetes object as JSON, before (or instead of) parsing: the one spelling of that type.
Obj = dict[str, Any]

SpecT = TypeVar("SpecT", bound=BaseModel)
StatusT = TypeVar("StatusT", bound=BaseModel)


class KubeObject(SpecModel, Generic[SpecT, StatusT]):
    """One object of ours as the apiserver returns it (apiVersion and kind are implied by the class)."""

    metadata: ObjectMeta
    spec: SpecT
    status: StatusT

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """Parse an object from the apiserver or the cache; a missing or null status is an empty one."""
        return cls.model_validate({**obj, "status": obj.get("status") or {}})

    @classmethod
    def parse_lenient_status(cls, obj: Mapping[str, Any]) -> tuple[Self, bool]:
        """Like `parse`, but a status that does not validate reads as empty: (object, whether it did).

        For readers that show an object before its status is trusted (the API shows it as not reconciled
        yet); a spec or metadata that does not validate still raises.
        """
        try:
            return cls.parse(obj), True
        except ValidationError as exc:
            if any(error["loc"][:1] != ("status",) for error in exc.errors()):
                raise
        return cls.parse({**obj, "status": {}}), False

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def key(self) -> str:
        return self.metadata.key

    def dump_status(self) -> dict[str, Any]:
        """The status as the apiserver stores it: camelCase, only stored or set keys, the stored time format."""
        return self.status.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")


class ShardObject(KubeObject[ShardSpec, ShardStatus]):
    status: ShardStatus = Field(default_factory=ShardStatus)


class ConsumerObject(KubeObject[ConsumerSpec, ConsumerStatus]):
    status: ConsumerStatus = Field(default_factory=ConsumerStatus)


class DatabaseObject(KubeObject[DatabaseSpec, DatabaseStatus]):
    status: DatabaseStatus = Field(default_factory=DatabaseStatus)


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
