"""The shared vocabulary of the provider: API group, kinds, label keys, phases, reasons.

Everything that the API, the reconciler, the manifests and the alerts must spell identically lives here,
so that a typo becomes an import error instead of a silently unmatched label or condition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from domain.settings import SETTINGS

GROUP = "db.bnerd.com"
# The version the provider reads and writes, and the storage version of the CRDs.
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# Every version the CRDs serve, with one schema (conversion None: the apiserver only rewrites
# apiVersion). Same schema because a write through one version prunes what only the other one has.
# v1alpha1 stays the storage version while a rollback to 0.1.0 (which serves only v1alpha1) must
# work; docs/upgrade.md ("CRD versions") says how storage moves to v1beta1 later.
SERVED_VERSIONS = ("v1alpha1", "v1beta1")
STORAGE_VERSION = VERSION
SERVED_API_VERSIONS = tuple(f"{GROUP}/{version}" for version in SERVED_VERSIONS)

# Kinds, plurals (the REST resource names) and singulars, as the CRDs declare them.
KIND_SHARD = "Shard"
KIND_CONSUMER = "Consumer"
KIND_DATABASE = "Database"
KIND_DATABASE_MOVE = "DatabaseMove"
PLURAL_SHARDS = "shards"
PLURAL_CONSUMERS = "consumers"
PLURAL_DATABASES = "databases"
PLURAL_DATABASE_MOVES = "databasemoves"
SINGULAR_SHARD = "shard"
SINGULAR_CONSUMER = "consumer"
SINGULAR_DATABASE = "database"
SINGULAR_DATABASE_MOVE = "databasemove"


@dataclass(frozen=True)
class KindNames:
    """How one of our kinds is spelt: Kind, REST plural, singular (the CRD's `names`)."""

    kind: str
    plural: str
    singular: str


# Per kind key (the key the CRD template and the schema generator use): its names.
KINDS: dict[str, KindNames] = {
    SINGULAR_SHARD: KindNames(KIND_SHARD, PLURAL_SHARDS, SINGULAR_SHARD),
    SINGULAR_CONSUMER: KindNames(KIND_CONSUMER, PLURAL_CONSUMERS, SINGULAR_CONSUMER),
    SINGULAR_DATABASE: KindNames(KIND_DATABASE, PLURAL_DATABASES, SINGULAR_DATABASE),
    SINGULAR_DATABASE_MOVE: KindNames(KIND_DATABASE_MOVE, PLURAL_DATABASE_MOVES, SINGULAR_DATABASE_MOVE),
}

# The consumer cluster's kind, served there by the agent's CRD (not one of the provider's KINDS).
KIND_CLAIM = "DatabaseClaim"
CLAIM_NAMES = KindNames(KIND_CLAIM, "databaseclaims", "databaseclaim")
# Held on a claim until the provider accepted its DELETE (deletionPolicy Delete) or the claim is orphaned.
FINALIZER_CLAIM = f"{GROUP}/claim"
# On a claim: any new value asks the agent for a rotation now (e.g. `date +%s`); on a claim whose
# provider is gone for good, DETACH lets it be deleted without the provider (the database is left).
ANNOTATION_CLAIM_ROTATE = f"{GROUP}/rotate"
ANNOTATION_CLAIM_DETACH = f"{GROUP}/detach"
# On the Secret the agent writes: the claim's name (label, what the agent watches) and the provider's
# credentialsVersion of the values in it (annotation, changes with every new password or endpoint).
LABEL_CLAIM = f"{GROUP}/claim"
ANNOTATION_CREDENTIALS_VERSION = f"{GROUP}/credentials-version"
# servicebinding.io: a claim is a provisioned service; its Secret has the spec's type and keys.
LABEL_PROVISIONED_SERVICE = "servicebinding.io/provisioned-service"
BINDING_SECRET_TYPE = "servicebinding.io/postgresql"
BINDING_TYPE = "postgresql"
BINDING_PROVIDER = "dbprovider"


class DeletionPolicy(enum.StrEnum):
    """DatabaseClaim.spec.deletionPolicy: what deleting the claim does to the database and its Secret."""

    DELETE = "Delete"
    ORPHAN = "Orphan"


class ClaimPhase(enum.StrEnum):
    """DatabaseClaim.status.phase: the provider's phase, or Pending before the provider has the database."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DELETING = "Deleting"
    FAILED = "Failed"


# The install's defaults the command line shows before anything is parsed (domain.config uses them too):
# here, beside the other plain names, so `dbprovider --help` needs no pydantic model.
DEFAULT_NAMESPACE = "dbprovider"
DEFAULT_RELEASE_NAME = "dbprovider"
# The key of a Consumer's token-hash Secret unless its tokenSecretRef names another.
DEFAULT_TOKEN_KEY = "sha256"

# Core objects we write or read in manifests (the credentials Secret, the landscape's token Secrets).
CORE_API_VERSION = "v1"
KIND_SECRET = "Secret"

# A size class name is a label-value-like name (Database.spec.sizeClass, the install's sizeClasses keys).
SIZE_CLASS_MAX_LENGTH = 63

# Labels put on every Database object (values pass through naming.label_value): used for selection only;
# code must re-check spec.consumer / spec.externalId on the object it found, a label is not an identity.
LABEL_CONSUMER = f"{GROUP}/consumer"
LABEL_EXTERNAL_ID = f"{GROUP}/external-id"
LABEL_SHARD = f"{GROUP}/shard"
# On the DatabaseMoves a shard's drain creates: the drained shard's name.
LABEL_DRAIN = f"{GROUP}/drain"

# The `shard` label value of Databases not placed yet (fleet gauges), and the Database work queue's
# lane for them (placement runs no SQL). A Shard name is a DNS label: a Shard named so would share it.
UNPLACED = "unplaced"

# Set by the API's DELETE (value: RFC 3339 UTC time of the request); its presence starts the soft delete.
ANNOTATION_DELETE_REQUESTED_AT = f"{GROUP}/delete-requested-at"
# Set (with the request time) by the API's rotate route: the reconciler sets a new password once per value.
ANNOTATION_ROTATE_REQUESTED_AT = f"{GROUP}/rotate-requested-at"
# Set by the rotate route with `terminateSessions: true` (value: the same request time): once that
# rotation's password is set, the tenant's sessions (opened with the old password) are ended.
ANNOTATION_ROTATE_END_SESSIONS = f"{GROUP}/rotate-end-sessions"
# Set by the rotate route with an overlap (value: the overlap in seconds; absent: none): the new
# password goes on the tenant's other login role, and the previous one logs in until the overlap ends.
ANNOTATION_ROTATE_OVERLAP = f"{GROUP}/rotate-overlap-seconds"
# Held on every Database until its tenant is dropped (or it never got one).
# Set by an operator when re-creating a Database whose object was lost (e.g. a held delete whose
# finalizer was removed): "<shard>/<tenant name>" adopts that existing tenant instead of placing anew.
ANNOTATION_RESTORE_TENANT = f"{GROUP}/restore-tenant"
FINALIZER_TENANT = f"{GROUP}/tenant"
# Held on every Shard (while deletion protection is on) until no Database is placed on it: a delete of a
# Shard whose status.databaseCount lies is held, not done (reconciler.shard.deletion).
FINALIZER_SHARD_DATABASES = f"{GROUP}/shard-databases"
# On a DatabaseMove while it runs: its deletion first undoes what the move made on the shards.
FINALIZER_MOVE = f"{GROUP}/move"

# On the leader Lease: which release holds it, and the lease duration replicas of that release (and
# newer ones) honour; older releases see only spec.leaseDurationSeconds (informers.leader).
ANNOTATION_LEADER = f"{GROUP}/leader"
# On the consumer agent's Lease: when the leading agent last heard from the provider (a whole pass).
ANNOTATION_AGENT_LAST_SYNC = f"{GROUP}/last-sync"

# On the credentials Secret: a random id that changes with every new password (never derived from
# it). The Database's status.passwordApplied holds the id whose password is set on the role; while
# the two differ, a new password is pending and the API does not hand it out.
ANNOTATION_PASSWORD_ID = f"{GROUP}/password-id"

# Keys of the credentials Secret `<database-name>-credentials`.
CREDENTIALS_SECRET_SUFFIX = "-credentials"
CREDENTIALS_KEYS = ("host", "port", "database", "user", "password", "sslmode")
# Labels of every credentials Secret, and the selector of the only Secrets informer: no other Secret
# of the release namespace (admin credentials, TLS keys) is listed, watched or cached by label.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dbprovider"
CREDENTIALS_SECRET_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_CONSUMER}"
# The metadata-only watch the consumers' token Secrets are found by: every Secret of the release
# namespace but the provider's own (the credentials Secrets, cached in full by the selector above).
NOT_PROVIDER_MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}!={MANAGED_BY}"

# The second shard engine: a Keldon (Apache Cloudberry) DatabaseCluster.
KELDON_GROUP = "keldon.io"
KELDON_VERSION = "v1alpha1"
KELDON_KIND_DATABASE_CLUSTER = "DatabaseCluster"
KELDON_PLURAL_DATABASE_CLUSTERS = "databaseclusters"
KELDON_PHASE_RUNNING = "Running"
KELDON_PHASE_SCALING = "Scaling"  # segments are added: running, but catalog changes are not safe
KELDON_CLIENT_PORT = 5432


class Engine(enum.StrEnum):
    """Shard engine; a Database is only placed on shards of its own engine."""

    POSTGRES = "postgres"
    CLOUDBERRY = "cloudberry"


class SslMode(enum.StrEnum):
    """libpq sslmode values accepted for the admin and the client endpoint."""

    DISABLE = "disable"
    ALLOW = "allow"
    PREFER = "prefer"
    REQUIRE = "require"
    VERIFY_CA = "verify-ca"
    VERIFY_FULL = "verify-full"

    @property
    def always_tls(self) -> bool:
        """libpq connects only over TLS in this mode (disable, allow and prefer may go without it)."""
        return self in (SslMode.REQUIRE, SslMode.VERIFY_CA, SslMode.VERIFY_FULL)


# Where the pod finds the install's shardTLS.caBundle (mounted by the Deployment template; see settings).
SHARD_CA_FILE = SETTINGS.files.shard_ca


class Phase(enum.StrEnum):
    """Database.status.phase."""

    PROVISIONING = "Provisioning"
    READY = "Ready"
    DELETING = "Deleting"
    DELETED = "Deleted"
    FAILED = "Failed"


class MoveMode(enum.StrEnum):
    """DatabaseMove.spec.mode: how the data is copied."""

    ONLINE = "Online"  # logical replication; writes pause only for the cutover
    OFFLINE = "Offline"  # the tenant closed, dump and restore; writes pause for the whole copy
    AUTO = "Auto"  # online when both shards allow it, else offline


class MovePhase(enum.StrEnum):
    """DatabaseMove.status.phase."""

    PENDING = "Pending"
    PREFLIGHT = "Preflight"
    COPYING = "Copying"
    CATCHING_UP = "CatchingUp"
    CUTTING_OVER = "CuttingOver"
    COMPLETED = "Completed"
    ROLLING_BACK = "RollingBack"
    ABORTED = "Aborted"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


class MoveConditionType(enum.StrEnum):
    """Condition types on a DatabaseMove."""

    READY = "Ready"  # True once Completed; the reason says why not (yet)
    ROLLBACK = "Rollback"  # True while a Completed move can be rolled back (the rollback window)


class MoveReason(enum.StrEnum):
    """Reasons of a DatabaseMove's Ready condition."""

    PENDING = "Pending"
    PREFLIGHT_FAILED = "PreflightFailed"  # the message names what the shards or the database lack
    IN_PROGRESS = "InProgress"
    NO_CAPACITY = "NoCapacity"  # target any: no shard has room; tried again
    COMPLETED = "Completed"
    ABORTED = "Aborted"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    WINDOW_OPEN = "WindowOpen"  # Rollback: the source's copy is kept until status.rollbackUntil
    WINDOW_ENDED = "WindowEnded"  # Rollback: the source's copy was dropped
    ROLLBACK_REFUSED = "RollbackRefused"  # Rollback: the message says why spec.rollback is not done
    DATABASE_DELETED = "DatabaseDeleted"  # Rollback: the Database is being deleted; the stream back ended
    SOURCE_SHARD_GONE = "SourceShardGone"  # Rollback: the source Shard was deleted; the stream back ended


# DatabaseMove.spec.target meaning "a shard chosen by placement".
MOVE_TARGET_ANY = "any"


class ConditionStatus(enum.StrEnum):
    """metav1.Condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class DatabaseConditionType(enum.StrEnum):
    """Condition types on a Database."""

    READY = "Ready"
    DELETION_HELD = "DeletionHeld"
    CONNECTION_LIMIT_DRIFT = "ConnectionLimitDrift"
    TENANT_DISABLED = "TenantDisabled"
    TENANT_DROPPED = "TenantDropped"
    OWNERSHIP_RECORDED = "OwnershipRecorded"


class DatabaseReason(enum.StrEnum):
    """Reasons of a Database's Ready condition (also the `reason` label of reconcile error metrics)."""

    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    NO_CAPACITY = "NoCapacity"
    SHARDS_UNAVAILABLE = "ShardsUnavailable"
    INVALID_SIZE_CLASS = "InvalidSizeClass"
    SHARD_NOT_FOUND = "ShardNotFound"
    ADMIN_UNAVAILABLE = "AdminUnavailable"
    ENSURE_FAILED = "EnsureFailed"
    CREDENTIALS_SECRET_CONFLICT = "CredentialsSecretConflict"
    DELETING = "Deleting"
    SET_LIMIT_FAILED = "SetLimitFailed"
    DISABLE_FAILED = "DisableFailed"
    DROP_FAILED = "DropFailed"
    RESTORE_REFUSED = "RestoreRefused"
    # The placed shard is not Ready (or stopped answering): the SQL waits, retried when it is Ready.
    SHARD_NOT_READY = "ShardNotReady"
    # Provisioned, but a fresh login with the database's own credentials through the client endpoint failed.
    LOGIN_FAILED = "LoginFailed"
    # The delete annotation was removed, but the tenant's connection limit does not fit its shard's budget
    # any more: it stays disabled (phase Deleting) until it fits, then is recovered.
    RECOVERY_OVER_BUDGET = "RecoveryOverBudget"
    # That login was not bound to TLS, and afterwards the database held what the provider did not make.
    LOGIN_TAMPERED = "LoginTampered"


class OwnershipReason(enum.StrEnum):
    """Reasons of the OwnershipRecorded condition: does the tenant role's ownership record name this
    Database (checked once per Ready database; tenants made before records existed are adopted)?"""

    RECORDED = "Recorded"
    ADOPTED = "Adopted"
    FOREIGN_ROLE = "ForeignRole"
    OWNED_BY_OTHER = "OwnedByOther"
    TENANT_MISSING = "TenantMissing"


class DriftReason(enum.StrEnum):
    """Reasons of the ConnectionLimitDrift condition."""

    CONFIG_CHANGED = "ConfigChanged"
    UNKNOWN_SIZE_CLASS = "UnknownSizeClass"


class ShardConditionType(enum.StrEnum):
    """Condition types on a Shard.

    WEAK_ROLE_ISOLATION is True on servers before PostgreSQL 16 (and Cloudberry), where CREATEROLE may
    manage any non-superuser role, not only the ones the provisioner created. CONNECTION_BUDGET_EXCEEDED
    is True while the databases placed on the shard commit more connections than its budget.
    """

    READY = "Ready"
    ADMIN_AUTH_FAILED = "AdminAuthFailed"
    UNREACHABLE = "Unreachable"
    WEAK_ROLE_ISOLATION = "WeakRoleIsolation"
    CONNECTION_BUDGET_EXCEEDED = "ConnectionBudgetExceeded"
    SCALING = "Scaling"  # cloudberry only: True while the DatabaseCluster is Scaling (since lastTransitionTime)
    # True while the Shard is deleted but Databases are still placed on it: held by its finalizer.
    DELETION_HELD = "DeletionHeld"
    # True while new Databases placed on it fail their Ready login at the client endpoint (reason LoginFailed).
    CLIENT_LOGIN_FAILING = "ClientLoginFailing"
    # While spec.drain is true and databases remain (False once none remain, or drain is set back to false):
    # the message counts the databases moved, moving, failed and waiting.
    DRAINING = "Draining"


class DrainReason(enum.StrEnum):
    """Reasons of a Shard's Draining condition."""

    MOVING = "Moving"  # moves run or are about to start
    NO_CAPACITY = "NoCapacity"  # no other shard has room (maxDatabases, connection budget) for the next one
    MOVES_FAILED = "MovesFailed"  # only databases whose move failed (or that cannot be moved) remain
    DRAINED = "Drained"  # no database left on the shard
    STOPPED = "Stopped"  # drain set back to false


class ShardReason(enum.StrEnum):
    """Reasons of a Shard's Ready condition.

    PROVISIONER_INHERITS: a pre-16 server whose provisioner role has INHERIT (refused: it would gain the
    tenants' privileges). SERVER_BEFORE_16 is the reason of the WeakRoleIsolation condition.
    ADMIN_TLS_REQUIRED: admin.sslmode may go without TLS (disable, allow, prefer) and the shard is not in
    the install's shardTLS.cleartextShards; ADMIN_ENDPOINT_MISMATCH: the admin Secret is bound to another
    host or port than the Shard names. Both are decided before any connection is opened.
    OVERCOMMITTED is the reason of the ConnectionBudgetExceeded condition (the databases placed there
    commit more connections than the shard's budget).
    """

    OK = "Ok"
    ADMIN_AUTH_FAILED = "AdminAuthFailed"
    ADMIN_SECRET_INVALID = "AdminSecretInvalid"
    UNREACHABLE = "Unreachable"
    CLUSTER_NOT_RUNNING = "ClusterNotRunning"
    PROVISIONER_INHERITS = "ProvisionerInherits"
    PROVISIONER_INVALID = "ProvisionerInvalid"
    SERVER_BEFORE_16 = "ServerBefore16"
    ADMIN_TLS_REQUIRED = "AdminTlsRequired"
    ADMIN_ENDPOINT_MISMATCH = "AdminEndpointMismatch"
    OVERCOMMITTED = "Overcommitted"
    # The shard answers but cannot write: new sessions are read-only, it is a standby, or its disk is full.
    READ_ONLY = "ReadOnly"
    IN_RECOVERY = "InRecovery"
    DISK_FULL = "DiskFull"
    # A cloudberry cluster is Scaling: placement pauses (catalog changes are not safe meanwhile).
    CLUSTER_SCALING = "ClusterScaling"
    # The shard's engine cannot be watched (its CRD is missing or not served): nothing is known about it.
    ENGINE_UNAVAILABLE = "EngineUnavailable"
    # The reason of DeletionHeld: the Shard was deleted while Databases are still placed on it.
    DATABASES_REMAIN = "DatabasesRemain"
    # The reason of ClientLoginFailing: new databases placed here did not log in at the client endpoint.
    LOGIN_FAILED = "LoginFailed"


class EventReason(enum.StrEnum):
    """Reasons of the Kubernetes Events on a Database (the audit trail); warnings use the condition reason."""

    CREATED = "Created"
    READY = "Ready"
    DELETE_REQUESTED = "DeleteRequested"
    DISABLED = "Disabled"
    DROPPED = "Dropped"
    DELETION_HELD = "DeletionHeld"
    TENANT_ADOPTED = "TenantAdopted"
    TENANT_RECREATED = "TenantRecreated"
    # After a failover that lost them: a soft delete's disable, or a recovery's enable, done again.
    TENANT_DISABLED_AGAIN = "TenantDisabledAgain"
    TENANT_ENABLED_AGAIN = "TenantEnabledAgain"
