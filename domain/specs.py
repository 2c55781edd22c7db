"""Typed `spec` of the Shard, Consumer, Database, DatabaseMove and DatabaseClaim objects (group db.bnerd.com/v1alpha1).

The models parse the object's `spec` dict as the apiserver returns it (camelCase keys). Cross-field rules
exist twice by necessity, in Python (`_check_engine_refs`) and as CEL in the JSON schema
(`SHARD_CEL_RULES`) for the CRD; keep the two together here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator
from pydantic.config import JsonValue
from pydantic_core import PydanticCustomError

from domain.config import Duration, check_rotation_overlap
from domain.constants import (
    DEFAULT_TOKEN_KEY,
    MOVE_TARGET_ANY,
    SIZE_CLASS_MAX_LENGTH,
    DeletionPolicy,
    Engine,
    MoveMode,
    SslMode,
)
from domain.validation import (
    CaCertPem,
    ClientHost,
    ExternalId,
    Namespace,
    ObjectName,
    PgIdentifier,
    Port,
    SecretKey,
    ServiceName,
    SpecModel,
    object_name_schema,
)

SSLMODES: tuple[str, ...] = tuple(mode.value for mode in SslMode)
DESCRIPTION_MAX_LENGTH = 256
DEFAULT_PORT = 5432
DRAIN_MOVES_DEFAULT = 2  # a shard's databases moved at once while it drains
DRAIN_MOVES_MAX = 16

_IMMUTABLE: list[JsonValue] = [{"rule": "self == oldSelf", "message": "is immutable"}]
_ENGINE_EXPR = "(has(self.engine) ? self.engine : 'postgres')"
# Written once: the CRD's CEL rule and ShardSpec's validator refuse a postgres Shard without it in the same words.
_ADMIN_SERVICE_NAME_REQUIRED = "admin.serviceName is required when engine is postgres"

# (CEL rule on ShardSpec, message): the CRD's form of ShardSpec._check_engine_refs.
SHARD_CEL_RULES: tuple[tuple[str, str], ...] = (
    (
        f"{_ENGINE_EXPR} != 'postgres' || (has(self.perconaCluster) && !has(self.keldonCluster))",
        "engine postgres requires perconaCluster and forbids keldonCluster",
    ),
    (
        f"{_ENGINE_EXPR} != 'cloudberry' || (has(self.keldonCluster) && !has(self.perconaCluster))",
        "engine cloudberry requires keldonCluster and forbids perconaCluster",
    ),
    (
        f"{_ENGINE_EXPR} != 'postgres' || has(self.admin.serviceName)",
        _ADMIN_SERVICE_NAME_REQUIRED,
    ),
)


# Added in 0.2.0 (optional: objects without it, and releases that do not know it, keep working).
Description = Annotated[
    StrictStr | None,
    Field(
        default=None,
        max_length=DESCRIPTION_MAX_LENGTH,
        description="Free text for people (owning team, ticket); the provider does not act on it. Shown by "
        "`kubectl get -o wide`.",
    ),
]


class ClusterRef(SpecModel):
    """A namespaced reference to the database cluster behind a shard (Percona PG or Keldon)."""

    namespace: Namespace = Field(description="Namespace of the cluster object.")
    name: ObjectName = Field(description="Name of the cluster object.")


class AdminSecretRef(SpecModel):
    """Where the provisioner credentials live; read by name only (RBAC is scoped to shardSecrets)."""

    namespace: Namespace = Field(description="The release namespace, or a namespace listed in shardSecrets.")
    name: ObjectName = Field(description="Secret name; must be listed in shardSecrets outside the release namespace.")
    user_key: SecretKey = Field(default="user", description="Key holding the role name.")
    password_key: SecretKey = Field(default="password", description="Key holding the password.")


class AdminEndpoint(SpecModel):
    """How the provider reaches the shard for DDL: the primary Service, never pgBouncer."""

    service_name: ServiceName | None = Field(
        default=None,
        description="The in-cluster primary Service (in the cluster's namespace). Required for postgres; "
        "for cloudberry defaults to the DatabaseCluster's name (its client Service).",
    )
    port: Port = Field(default=DEFAULT_PORT, description="Service port.")
    sslmode: SslMode = Field(default=SslMode.REQUIRE, description="libpq sslmode of the admin connection.")
    secret_ref: AdminSecretRef = Field(description="Secret with the provisioner role's credentials.")


class Pooler(SpecModel):
    """pgBouncer in front of the shard, authenticating tenants with `auth_user` and `auth_query`."""

    auth_user: PgIdentifier = Field(
        description="pgBouncer's auth_user (Percona: _crunchypgbouncer). Each new tenant database grants it "
        "CONNECT (GRANT CONNECT ON DATABASE <tenant> TO <authUser>, run as the tenant), so its auth_query "
        "can run there."
    )
    template: PgIdentifier = Field(
        default="template1",
        description="The database new tenant databases are copied from (CREATE DATABASE ... TEMPLATE <template>) "
        "instead of template0: it must hold the auth_query function (Percona keeps it in template1) and "
        "accept no tenant's connections.",
    )


class ClientEndpoint(SpecModel):
    """What consumers are told to connect to (written into their credentials, never used by the provider)."""

    host: ClientHost = Field(description="Hostname (RFC 1123, no trailing dot) or dotted-quad IPv4.")
    port: Port = Field(default=DEFAULT_PORT, description="Port consumers connect to.")
    sslmode: SslMode = Field(default=SslMode.REQUIRE, description="libpq sslmode handed to consumers.")
    pooler: Pooler | None = Field(
        default=None,
        description="Set when the client endpoint is pgBouncer with an auth_query that runs in each database "
        "(pgBouncer before 1.19, or without auth_dbname): what new tenant databases need for it.",
    )
    ca_cert: CaCertPem | None = Field(
        default=None,
        description="PEM CA certificates that sign the endpoint's server certificate (public, never a key). "
        "Handed to consumers with their credentials, so they can use sslmode verify-ca or verify-full.",
    )


class ShardSpec(SpecModel):
    """One database cluster the provider may place tenant databases into."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in SHARD_CEL_RULES]
        }
    }

    engine: Engine = Field(
        default=Engine.POSTGRES,
        description="Database engine; Databases are only placed on shards of their engine.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    accepting: StrictBool = Field(default=True, description="false drains the shard: no new placements.")
    drain: StrictBool = Field(
        default=False,
        description="true moves every database off this shard with DatabaseMove objects, drainMoves at a "
        "time, each to a shard chosen like a new placement; the shard takes no new placements meanwhile. "
        "false starts no more moves (running ones finish). Progress: the Draining condition.",
    )
    drain_moves: StrictInt = Field(
        default=DRAIN_MOVES_DEFAULT,
        ge=1,
        le=DRAIN_MOVES_MAX,
        description="While drain is true: how many of this shard's databases are moved at the same time.",
    )
    max_databases: StrictInt = Field(
        ge=1, description="Limit of databases placed on this shard: placement never goes over it, even in a burst."
    )
    percona_cluster: ClusterRef | None = Field(
        default=None, description="The Percona PG cluster (engine postgres only)."
    )
    keldon_cluster: ClusterRef | None = Field(
        default=None, description="The Keldon DatabaseCluster (engine cloudberry only)."
    )
    admin: AdminEndpoint = Field(description="The provider's DDL connection.")
    client: ClientEndpoint = Field(description="The endpoint handed to consumers.")
    description: Description = None

    @model_validator(mode="before")
    @classmethod
    def _default_cloudberry_service(cls, data: Any) -> Any:
        """For cloudberry the admin Service is the DatabaseCluster's client Service, named like it."""
        if not isinstance(data, dict) or data.get("engine") != Engine.CLOUDBERRY:
            return data
        admin = data.get("admin")
        keldon = data.get("keldonCluster", data.get("keldon_cluster"))
        if not isinstance(admin, dict) or not isinstance(keldon, dict) or "name" not in keldon:
            return data
        if admin.get("serviceName") is None and admin.get("service_name") is None:
            admin = {k: v for k, v in admin.items() if k not in ("serviceName", "service_name")}
            return {**data, "admin": {**admin, "serviceName": keldon["name"]}}
        return data

    @model_validator(mode="after")
    def _check_engine_refs(self) -> ShardSpec:
        """Exactly the cluster reference of the engine, and an admin Service for postgres."""
        problems: list[str] = []
        if self.engine == Engine.POSTGRES:
            if self.percona_cluster is None:
                problems.append("perconaCluster is required when engine is postgres")
            if self.keldon_cluster is not None:
                problems.append("keldonCluster must not be set when engine is postgres")
            if self.admin.service_name is None:
                problems.append(_ADMIN_SERVICE_NAME_REQUIRED)
        else:
            if self.keldon_cluster is None:
                problems.append("keldonCluster is required when engine is cloudberry")
            if self.percona_cluster is not None:
                problems.append("perconaCluster must not be set when engine is cloudberry")
        if problems:
            raise PydanticCustomError("engine_refs", "; ".join(problems))
        return self

    @property
    def cluster(self) -> ClusterRef:
        """The cluster reference of this shard's engine."""
        ref = self.percona_cluster if self.engine == Engine.POSTGRES else self.keldon_cluster
        assert ref is not None  # guaranteed by _check_engine_refs
        return ref

    @property
    def admin_service_name(self) -> str:
        """The admin Service name (explicit, or the DatabaseCluster's name for cloudberry)."""
        name = self.admin.service_name
        assert name is not None  # guaranteed by _default_cloudberry_service / _check_engine_refs
        return name

    @property
    def admin_host(self) -> str:
        """In-cluster DNS name of the admin Service: `<serviceName>.<cluster namespace>.svc`."""
        return f"{self.admin_service_name}.{self.cluster.namespace}.svc"


class TokenSecretRef(SpecModel):
    """The Secret key holding the consumer's token hashes (must be in the release namespace to work)."""

    namespace: Namespace = Field(description="Must be the release namespace; elsewhere never authenticates.")
    name: ObjectName = Field(description="Secret name.")
    key: SecretKey = Field(default=DEFAULT_TOKEN_KEY, description="Key with one SHA-256 hex digest per line.")


class ConsumerSpec(SpecModel):
    """One calling cluster; it sees and acts on its own databases only."""

    token_secret_ref: TokenSecretRef = Field(description="Where the consumer's token hashes are stored.")
    max_databases: StrictInt | None = Field(
        default=None,
        ge=0,
        description="Quota of databases not yet Deleted; unset means unlimited (set it on every consumer).",
    )
    disabled: StrictBool = Field(default=False, description="true makes every call of this consumer 401.")
    description: Description = None


class DatabaseSpec(SpecModel):
    """One tenant database requested by a consumer; identity fields are immutable."""

    consumer: ObjectName = Field(
        description="Name of the owning Consumer object.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    external_id: ExternalId = Field(
        description="The consumer's id for the database (a DNS label).",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    size_class: StrictStr = Field(
        default="",
        max_length=SIZE_CLASS_MAX_LENGTH,
        description="Size class from the install config's sizeClasses; empty means connectionLimit.default.",
    )
    engine: Engine = Field(
        default=Engine.POSTGRES,
        description="Only shards of this engine are considered for placement.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )


class DatabaseMoveSpec(SpecModel):
    """A request to move one Database to another shard; the database and the target are immutable."""

    database: ObjectName = Field(
        description="Name of the Database to move (in the same namespace as this object).",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    target: ObjectName = Field(
        description=f"The Shard to move the database to, or {MOVE_TARGET_ANY!r}: a shard chosen like a new "
        "placement (its engine, accepting, within maxDatabases and the connection budget).",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    mode: MoveMode = Field(
        default=MoveMode.AUTO,
        description="Online: copied by logical replication, writes pause only for the cutover (both shards "
        "PostgreSQL 16+ with the grants `dbprovider move check` names). Offline: the database is closed, "
        "dumped and restored, writes pause for the whole copy. Auto: Online when both shards allow it.",
    )
    force: StrictBool = Field(
        default=False,
        description="Offline only: copy a database above the install's offline size limit anyway.",
    )
    abort: StrictBool = Field(default=False, description="true stops the move; the source keeps serving.")
    rollback: StrictBool = Field(
        default=False,
        description="true on a Completed move, within its rollback window (status.rollbackUntil): the database "
        "goes back to the source shard, with the writes made since the move; the target's copy is dropped.",
    )


# How long a claim's old credentials keep working after a rotation: the agent's poll plus the kubelet's
# sync of a mounted Secret, with room to spare.
CLAIM_ROTATION_OVERLAP = timedelta(minutes=10)


class ClaimRotation(SpecModel):
    """When the agent asks the provider for a new password on its own, and how long the old one keeps working."""

    interval: Duration | None = Field(
        default=None,
        description='Rotate this long after the last rotation (or after Ready), e.g. "30d"; unset: only on '
        "request (annotation db.bnerd.com/rotate).",
    )
    overlap: Annotated[Duration, AfterValidator(check_rotation_overlap)] | None = Field(
        default=None,
        description="How long the old username and password keep logging in after the new ones are in the "
        'Secret (unset: "10m"; at most "1d"); "0s": they stop when the new password is set, and the username '
        "stays the same.",
    )

    @property
    def overlap_seconds(self) -> int:
        """The overlap the agent asks the provider for, in seconds."""
        return int((CLAIM_ROTATION_OVERLAP if self.overlap is None else self.overlap).total_seconds())


CLAIM_ROLLOUT_MAX = 16  # Deployments one claim may roll
DeploymentName = Annotated[ObjectName, object_name_schema("A Deployment in the claim's namespace.")]
# (CEL rule on DatabaseClaimSpec, message): an optional databaseId is set at create or never.
CLAIM_CEL_RULES: tuple[tuple[str, str], ...] = (
    ("has(self.databaseId) == has(oldSelf.databaseId)", "databaseId is set when the claim is created, or never"),
)


class DatabaseClaimSpec(SpecModel):
    """A database of the provider, claimed from a consumer cluster; the agent keeps its Secret current."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in CLAIM_CEL_RULES]
        }
    }

    size_class: StrictStr = Field(
        default="",
        max_length=SIZE_CLASS_MAX_LENGTH,
        description="A size class the provider offers; empty means its default. Chosen at create time.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    database_id: ExternalId | None = Field(
        default=None,
        description="The database's externalId at the provider; unset: derived from namespace and name "
        "(status.databaseId shows it). Immutable.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    secret_name: ObjectName | None = Field(
        default=None,
        description="The Secret the agent writes the connection details into; unset: the claim's name.",
        json_schema_extra={"x-kubernetes-validations": _IMMUTABLE},
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="Delete: deleting the claim starts the provider's soft delete and the Secret goes with "
        "the claim. Orphan: the database and the Secret are left.",
    )
    rotation: ClaimRotation | None = Field(default=None, description="Scheduled rotation of the password.")
    rollout_deployments: Annotated[tuple[DeploymentName, ...], Field(max_length=CLAIM_ROLLOUT_MAX)] = Field(
        default=(),
        description="Deployments in the claim's namespace to roll when the Secret's values change (a new "
        "password or endpoint): the agent sets their pod template's annotation "
        "db.bnerd.com/credentials-version to the Secret's.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


# -- reading objects -------------------------------------------------------------------------------


def _spec(obj: Mapping[str, Any]) -> Any:
    return obj.get("spec") or {}


def parse_shard(obj: Mapping[str, Any]) -> ShardSpec:
    """The typed spec of a Shard object as the apiserver returns it; pydantic.ValidationError if invalid."""
    return ShardSpec.model_validate(_spec(obj))


def parse_consumer(obj: Mapping[str, Any]) -> ConsumerSpec:
    """The typed spec of a Consumer object; pydantic.ValidationError if invalid."""
    return ConsumerSpec.model_validate(_spec(obj))


_TOKEN_SECRET_REF_KEY = ConsumerSpec.model_fields["token_secret_ref"].alias or "tokenSecretRef"


def parse_token_secret_ref(obj: Mapping[str, Any]) -> TokenSecretRef | None:
    """A Consumer's tokenSecretRef even when another field of its spec is invalid; None if the ref is."""
    spec = _spec(obj)
    raw = spec.get(_TOKEN_SECRET_REF_KEY) if isinstance(spec, Mapping) else None
    try:
        return TokenSecretRef.model_validate(raw)
    except ValidationError:
        return None


def parse_database_move(obj: Mapping[str, Any]) -> DatabaseMoveSpec:
    """The typed spec of a DatabaseMove object (ValidationError if it does not fit the model)."""
    return DatabaseMoveSpec.model_validate(_spec(obj))


def parse_claim(obj: Mapping[str, Any]) -> DatabaseClaimSpec:
    """The typed spec of a DatabaseClaim object; pydantic.ValidationError if invalid."""
    return DatabaseClaimSpec.model_validate(_spec(obj))


def parse_database(obj: Mapping[str, Any]) -> DatabaseSpec:
    """The typed spec of a Database object; pydantic.ValidationError if invalid."""
    return DatabaseSpec.model_validate(_spec(obj))


_CONSUMER_KEY = DatabaseSpec.model_fields["consumer"].alias or "consumer"


def database_consumer_name(obj: Mapping[str, Any]) -> str | None:
    """`spec.consumer` of a Database object without parsing the whole spec, for index functions and
    event handlers that run on every event of every Database; None unless a non-empty string."""
    spec = obj.get("spec")
    consumer = spec.get(_CONSUMER_KEY) if isinstance(spec, Mapping) else None
    return consumer if isinstance(consumer, str) and consumer else None


_EXTERNAL_ID_KEY = DatabaseSpec.model_fields["external_id"].alias or "externalId"


def database_external_id(obj: Mapping[str, Any]) -> str | None:
    """`spec.externalId` of a Database object without parsing the whole spec (as `database_consumer_name`)."""
    spec = obj.get("spec")
    external_id = spec.get(_EXTERNAL_ID_KEY) if isinstance(spec, Mapping) else None
    return external_id if isinstance(external_id, str) and external_id else None
