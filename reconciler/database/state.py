"""`Database`: one reconcile's working state, the typed spec and the status being built.

The metadata, spec and status are parsed once (domain.metadata.ObjectMeta, domain.specs.DatabaseSpec,
domain.status.DatabaseStatus) when the pass reads the object, the parts change typed fields, and
`status_body()` dumps them once for the status patch. The dump keeps only the keys that were stored
or set by this pass (no default values appear out of nowhere) and timestamps in the stored format,
so the dump of an unchanged status equals what is stored and `update_status` writes nothing.

Events about a status change the pass makes (a new failure reason, drift) wait in the pass until
the status write that records the change succeeded (`after_write`, sent by `DatabaseWrites.status`):
a write that fails (409: another writer came first) drops them, and the next pass, which sees the
old status again, decides them anew, so one change becomes one Event, not one per attempt.

Status keys the model does not know (written by a newer release, whose CRD has them) are kept as they
are: the dump puts them back, so the merge patch never removes them. A release that dropped them
(0.1.0 did) would remove a newer release's fields on every write (docs/upgrade.md, mixed versions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from domain.conditions import Condition, condition_is_true, find_condition, with_condition, without_condition
from domain.metadata import ObjectMeta
from domain.objects import DatabaseObject, status_body
from domain.specs import DatabaseSpec
from domain.status import DatabaseStatus


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class Database:
    """The object as last read or written (for writes), its metadata and spec, and the status being built."""

    db: dict[str, Any]
    meta: ObjectMeta
    spec: DatabaseSpec
    status: DatabaseStatus
    _after_write: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @classmethod
    def read(cls, db: dict[str, Any]) -> Database:
        """Parse metadata, spec and status (pydantic ValidationError if the object does not fit the models)."""
        parsed = DatabaseObject.parse(db)
        return cls(db, parsed.metadata, parsed.spec, parsed.status)

    def load(self, db: dict[str, Any]) -> None:
        """Continue from `db` (as just written or read live): the status being built starts over from it."""
        parsed = DatabaseObject.parse(db)
        self.db, self.meta, self.spec, self.status = db, parsed.metadata, parsed.spec, parsed.status

    def written(self, db: dict[str, Any]) -> None:
        """`db` is the object now (a metadata write's answer): its metadata; the status being built stays."""
        self.db = db
        self.meta = ObjectMeta.of(db)

    def after_write(self, send: Callable[[], None]) -> None:
        """Run `send` (an Event) once the next status write of this pass succeeded; never if it fails."""
        self._after_write.append(send)

    def take_after_write(self) -> list[Callable[[], None]]:
        """What waits for the status write, handed over once (the writer runs it after success)."""
        waiting, self._after_write = self._after_write, []
        return waiting

    # -- metadata ------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return _sent(self.meta.namespace, "namespace")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        return _sent(self.meta.uid, "uid")

    @property
    def resource_version(self) -> str:
        """What a conditional write of this object names (the apiserver always sends it)."""
        return _sent(self.meta.resource_version, "resourceVersion")

    @property
    def deleting(self) -> bool:
        """Kubernetes deletion was requested (metadata.deletionTimestamp): the object waits for its finalizers."""
        return self.meta.deleting

    @property
    def finalizers(self) -> tuple[str, ...]:
        return self.meta.finalizers

    @property
    def generation(self) -> int | None:
        return self.meta.generation

    @property
    def annotations(self) -> dict[str, str]:
        return self.meta.annotations

    @property
    def tenant(self) -> str:
        """The tenant name; set with the placement, before any step that needs it runs."""
        assert self.status.tenant_name is not None
        return self.status.tenant_name

    @property
    def shard(self) -> str:
        """The shard placed on; set with the placement, before any step that needs it runs."""
        assert self.status.shard is not None
        return self.status.shard

    # -- status --------------------------------------------------------------------------------------

    def update(self, **fields: Any) -> None:
        """Set status fields by their Python names (None removes a field from the stored status)."""
        unknown = fields.keys() - DatabaseStatus.model_fields.keys()
        if unknown:  # model_copy would keep a misspelt key, and the apiserver would prune it silently
            raise TypeError(f"DatabaseStatus has no field {', '.join(sorted(unknown))}")
        self.status = self.status.model_copy(update=fields)

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.status.conditions, type_)

    def is_true(self, type_: str) -> bool:
        return condition_is_true(self.status.conditions, type_)

    def reason(self, type_: str) -> str | None:
        found = self.condition(type_)
        return None if found is None else found.reason

    def set_condition(self, type_: str, status: bool, reason: str, message: str) -> bool:
        """Set condition `type_` for this generation; True if anything changed."""
        conditions, changed = with_condition(
            self.status.conditions, type_, status, reason, message, self.generation, now=_now()
        )
        if changed:
            self.update(conditions=conditions)
        return changed

    def remove_condition(self, type_: str) -> bool:
        conditions, changed = without_condition(self.status.conditions, type_)
        if changed:
            self.update(conditions=conditions)
        return changed

    def status_body(self) -> dict[str, Any]:
        """The status as the apiserver stores it: camelCase, only stored or set keys, stored time format,
        and every stored key the model does not know, unchanged."""
        return status_body(self.status, self.db.get("status"))  # the stored status: a newer release's keys

    def describe(self) -> str:
        """consumer, externalId and shard: what events and logs say about a database."""
        return (
            f"consumer={self.spec.consumer} externalId={self.spec.external_id} shard={self.status.shard or 'unplaced'}"
        )


def _sent(value: str | None, field: str) -> str:
    """A metadata field the apiserver sends on every stored Database (never "None" in a name or SQL)."""
    if value is None:
        raise ValueError(f"the Database has no metadata.{field}")
    return value
