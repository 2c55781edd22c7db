"""Typed `status` of the Shard, Consumer, Database and DatabaseMove objects: what the reconciler writes.

The CRDs' status schemas are generated from these models (infra.crds), exactly like the spec schemas from
domain.specs: a field the reconciler writes must exist here, or the apiserver prunes it on the status
update. Adding a field here adds it to the CRD on the next render / `pulumi up`.

Write status through the status subresource with camelCase keys, e.g.
`DatabaseStatus(...).model_dump(by_alias=True, exclude_none=True, mode="json")`. Every field is optional
so a partial status (an object seen for the first time) is valid; `observedGeneration` says which spec
generation the rest of the status describes. Conditions and how to change them: domain.conditions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, StrictInt, StrictStr

from domain.conditions import Condition, Conditions, Generation, StatusTime
from domain.config import ConnectionLimit
from domain.constants import SIZE_CLASS_MAX_LENGTH, ClaimPhase, MoveMode, MovePhase, Phase
from domain.validation import Count, ExternalId, ObjectName, SpecModel

__all__ = [
    "ClaimBinding",
    "Condition",
    "ConsumerStatus",
    "DatabaseClaimStatus",
    "DatabaseMoveStatus",
    "DatabaseStatus",
    "DroppedTenant",
    "ObjectStatus",
    "ShardStatus",
]


class ObjectStatus(SpecModel):
    """Base of the statuses of our kinds, so generic code (domain.objects) sets conditions on any of them.

    Each status declares `observedGeneration` and `conditions` itself, with its own description and in its
    own place in the CRD schema; they are declared here for the type checker only (no pydantic field).
    """

    if TYPE_CHECKING:
        observed_generation: int | None = None
        conditions: tuple[Condition, ...] = ()


# The most drops a Shard's status.droppedTenants holds (the oldest go first): a bound on its size.
MAX_DROPPED_TENANTS = 1000


class DroppedTenant(SpecModel):
    """A tenant dropped from the shard, remembered so that a failover that lost the drop has it repeated."""

    name: Annotated[StrictStr, Field(max_length=63)] = Field(description="The tenant's role and database name.")
    dropped_at: StatusTime = Field(description="When it was dropped (recorded just before the drop).")


class ShardStatus(ObjectStatus):
    """Observed state of a Shard, written by the Shard controller (periodic admin check every 60 s)."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation the conditions were computed for."
    )
    conditions: Conditions = ()
    database_count: Count | None = Field(
        default=None,
        description="Database objects placed on this shard (every phase, until the object is gone). While "
        "above 0, deleting the Shard is refused by the deletion-protection admission policy.",
    )
    server_version: Annotated[StrictStr, Field(max_length=64)] | None = Field(
        default=None,
        description="Server version seen on the admin connection (e.g. 16.4); below 16 the older grant "
        "dialect is used and role isolation is weaker (condition WeakRoleIsolation).",
    )
    connection_budget: Count | None = Field(
        default=None,
        description="Connections the tenants' CONNECTION LIMITs may add up to on this shard: the server's "
        "max_connections minus its superuser and reserved slots, the provider's own sessions and the "
        "install's connectionBudget.reserved (read at each check), times the install's "
        "connectionBudget.overcommit ratio for this shard. A database is placed only where its limit fits.",
    )
    connections_committed: Count | None = Field(
        default=None,
        description="The connection limits of the databases placed here (an unlimited one counts as the whole "
        "budget; a soft-deleted one whose tenant is disabled, nothing); above connectionBudget: condition "
        "ConnectionBudgetExceeded.",
    )
    databases_available: Count | None = Field(
        default=None,
        description="How many more databases of the default connection limit (connectionLimit.default) fit "
        "here now: below maxDatabases and within the connection budget (0 while the shard takes no databases: "
        "not Ready, not accepting or being deleted).",
    )
    timeline: Annotated[StrictInt, Field(ge=1)] | None = Field(
        default=None,
        description="The primary's timeline (it changes with each failover or switchover) for which every Ready "
        "database placed here has been verified: when a check finds another, each Ready database is verified "
        "once (a tenant lost in the failover is provisioned again, a tenant's password set again from its "
        "credentials Secret), and then this is set.",
    )
    dropped_tenants: Annotated[tuple[DroppedTenant, ...], Field(max_length=MAX_DROPPED_TENANTS)] = Field(
        default=(),
        description="Tenants recently dropped here (for softDelete.rememberDrops after the drop): when the "
        "primary's timeline changes, each one whose role or database is back (a failover lost its drop) is "
        "dropped again, unless a Database placed here still names it.",
    )


class ConsumerStatus(ObjectStatus):
    """Observed state of a Consumer."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    conditions: Conditions = ()
    database_count: Count | None = Field(
        default=None,
        description="This consumer's databases that are not yet Deleted (Deleting ones count): the number "
        "compared with spec.maxDatabases.",
    )


class DatabaseStatus(ObjectStatus):
    """Observed state of a Database; placement and tenant name are written once, before any SQL."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    phase: Phase | None = Field(default=None, description="Provisioning, Ready, Deleting, Deleted or Failed.")
    shard: ObjectName | None = Field(
        default=None,
        description="The Shard this database is placed on; persisted before any SQL runs, changed only by a "
        "DatabaseMove at its cutover or rollback.",
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
    applied_connection_limit: ConnectionLimit | None = Field(
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
    login_role: Annotated[StrictStr, Field(max_length=63, pattern="^[a-z_][a-z0-9_]*$")] | None = Field(
        default=None,
        description="The login role handed out (the credentials Secret's user) once a rotation with an overlap "
        "handed out the tenant's alternate role; empty: the tenant role.",
    )
    retire_login_at: StatusTime | None = Field(
        default=None,
        description="When the login role handed out before the last rotation with an overlap loses its login "
        "and password; empty: no overlap is running.",
    )


class DatabaseMoveStatus(ObjectStatus):
    """Observed state of a DatabaseMove: its phase, the two shards and how long writes paused."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    phase: MovePhase | None = Field(
        default=None,
        description="Pending, Preflight, Copying, CatchingUp, CuttingOver, Completed, RollingBack, Aborted, "
        "RolledBack or Failed.",
    )
    conditions: Conditions = ()
    source_shard: ObjectName | None = Field(default=None, description="The Shard the database is moved from.")
    target_shard: ObjectName | None = Field(
        default=None, description="The Shard the database is moved to (the one chosen when spec.target is any)."
    )
    mode: MoveMode | None = Field(
        default=None, description="How the database is copied, Online or Offline (chosen in the preflight for Auto)."
    )
    tenant_name: Annotated[StrictStr, Field(max_length=63, pattern="^[a-z_][a-z0-9_]*$")] | None = Field(
        default=None, description="Name of the tenant's role and database on both shards."
    )
    write_pause_seconds: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="How long the database took no writes during the move (the cutover, or the copy)."
    )
    started_at: StatusTime | None = Field(default=None, description="When the move started copying.")
    source_bytes: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Size of the database on the source shard when the move started copying."
    )
    target_bytes: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Size of the copy on the target shard when the move last looked (while copying and catching "
        "up; on disk, so it need not end equal to sourceBytes).",
    )
    tables_total: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Online moves: the tables the target subscribes to."
    )
    tables_copied: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Online moves: of those, the tables copied and streaming when the move last looked."
    )
    progress: Annotated[StrictStr, Field(max_length=128)] | None = Field(
        default=None,
        description="How far the copy is, for people: tables copied of all (online) and the target's size of the "
        "source's.",
    )
    completed_at: StatusTime | None = Field(
        default=None, description="When the move ended (Completed, Aborted, RolledBack or Failed)."
    )
    rollback_until: StatusTime | None = Field(
        default=None,
        description="Completed: until when the source shard keeps its copy of the database and spec.rollback "
        "may bring the database back there.",
    )
    source_dropped_at: StatusTime | None = Field(
        default=None,
        description="When the source shard's copy was dropped (the rollback window had ended), or given up "
        "(the source Shard was deleted).",
    )


class ClaimBinding(SpecModel):
    """servicebinding.io: the Secret a workload binds to."""

    name: ObjectName = Field(description="Name of the Secret with the connection details, in the claim's namespace.")


class DatabaseClaimStatus(ObjectStatus):
    """Observed state of a DatabaseClaim, written by the agent in the consumer cluster."""

    observed_generation: Generation | None = Field(
        default=None, description="The metadata.generation this status describes."
    )
    conditions: Conditions = ()
    phase: ClaimPhase | None = Field(
        default=None, description="Pending, Provisioning, Ready, Deleting or Failed (the provider's phase)."
    )
    database_id: ExternalId | None = Field(default=None, description="The database's externalId at the provider.")
    last_sync_time: StatusTime | None = Field(
        default=None, description="When the agent last heard from the provider about this claim."
    )
    drop_after: StatusTime | None = Field(
        default=None, description="While Deleting: the earliest time the provider drops the database."
    )
    binding: ClaimBinding | None = Field(default=None, description="The Secret to bind to, once it is written.")
    credentials_version: Annotated[StrictStr, Field(max_length=64)] | None = Field(
        default=None,
        description="The provider's credentialsVersion of the values in the Secret (changes with every new "
        "password or endpoint).",
    )
    rotation_requested: Annotated[StrictStr, Field(max_length=256)] | None = Field(
        default=None, description="The value of the db.bnerd.com/rotate annotation the agent last acted on."
    )
    last_rotation_time: StatusTime | None = Field(
        default=None, description="When the agent last asked the provider for a new password."
    )
