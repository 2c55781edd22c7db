"""The install config: the chart values, also the Pulumi stack config and the input of `render`.

Parsed once, strictly: unknown keys and wrong types fail with a ConfigError that names every offending
key as a dotted camelCase path, so a broken config stops the preview/render instead of a running manager.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from domain.constants import DEFAULT_NAMESPACE, DEFAULT_RELEASE_NAME, SIZE_CLASS_MAX_LENGTH
from domain.naming import DNS1035_LABEL_RE, DNS1123_SUBDOMAIN_RE, LABEL_VALUE_MAX_LENGTH, LABEL_VALUE_RE
from domain.settings import SETTINGS
from domain.sizing import MemoryQuantity, ResourcesConfig, SizingConfig, memory_bytes
from domain.validation import (
    ClientHost,
    ConfigModel,
    Count,
    Namespace,
    ObjectName,
    Port,
    SecretKey,
    validation_problems,
)
from domain.version import __version__

DEFAULT_IMAGE = f"ghcr.io/bnerd/dbprovider:{__version__}"
DEFAULT_BREAK_GLASS_GROUPS = ("system:masters",)
METRICS_SERVICE_SUFFIX = "-metrics"
# The release name prefixes Service names like `<release>-metrics`, which must stay DNS-1035 labels.
RELEASE_NAME_MAX_LENGTH = 63 - len(METRICS_SERVICE_SUFFIX)

DURATION_RE = "^(0|([0-9]+[dhms])+)$"
_DURATION_UNITS = {
    "d": timedelta(days=1),
    "h": timedelta(hours=1),
    "m": timedelta(minutes=1),
    "s": timedelta(seconds=1),
}
# A size class name: a label-value-like token, so it can be shown and labelled as is.
SIZE_CLASS_RE = f"^[A-Za-z0-9]([-A-Za-z0-9_.]{{0,{SIZE_CLASS_MAX_LENGTH - 2}}}[A-Za-z0-9])?$"
_PROMQL_FORBIDDEN = ('"', "\\", "\n", "\r", "`")
_LABEL_NAME_RE = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
DEFAULT_SCRAPE_INTERVAL = timedelta(seconds=30)
# Each alert's runbook_url is this plus `#<alert name in lowercase>` (a section of docs/operations.md).
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/bnerd/dbprovider/blob/main/docs/operations.md"


class ConfigError(ValueError):
    """The install config is invalid; `problems` lists (dotted camelCase key path, message) pairs."""

    def __init__(self, problems: tuple[tuple[str, str], ...]) -> None:
        self.problems = problems
        details = "; ".join(f"{path}: {msg}" if path else msg for path, msg in problems)
        super().__init__(f"invalid install config: {details}")


class UnknownSizeClass(LookupError):
    """A size class that the install config does not define (the API answers 400 unknown_size_class)."""

    def __init__(self, size_class: str) -> None:
        self.size_class = size_class
        shown = f" {size_class!r}" if re.fullmatch(SIZE_CLASS_RE, size_class) else ""
        super().__init__(f"unknown size class{shown}")


def parse_duration(value: object) -> timedelta:
    """Parse a retention like "7d", "36h", "90m", "30s", "1d12h" or "0"; negative or garbage is refused."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value
    if value == 0 and type(value) is int:
        return timedelta(0)
    if isinstance(value, str) and value.startswith("-"):
        raise ValueError("must not be negative")
    if not isinstance(value, str) or not re.fullmatch(DURATION_RE, value):
        raise ValueError('must be a duration such as "7d", "36h", "90m", "30s" or "0" (units d, h, m, s)')
    total = timedelta(0)
    try:
        for number, unit in re.findall("([0-9]+)([dhms])", value):
            total += int(number) * _DURATION_UNITS[unit]
    except (OverflowError, ValueError):
        raise ValueError("is too large") from None
    return total


def format_duration(value: timedelta) -> str:
    """The inverse of parse_duration, e.g. timedelta(hours=36) -> "1d12h"; zero -> "0s"."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _check_promql_text(value: str) -> str:
    """Refuse characters that would break out of a PromQL label matcher string."""
    if any(char in value for char in _PROMQL_FORBIDDEN):
        raise ValueError("must not contain '\"', '\\', '`' or a newline")
    return value


def _check_label_key(value: str) -> str:
    """A Kubernetes label/annotation key: `[prefix/]name`, prefix a DNS subdomain, name 1-63 characters."""
    prefix, _, name = value.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.fullmatch(DNS1123_SUBDOMAIN_RE, prefix)):
        raise ValueError("key prefixes must be DNS subdomains (lowercase letters, digits, '-' and '.')")
    if not 0 < len(name) <= 63 or not re.fullmatch(_LABEL_NAME_RE, name):
        raise ValueError("keys must be 1-63 letters, digits, '-', '_' or '.', optionally after 'prefix/'")
    return value


def _check_label_value(value: str) -> str:
    if len(value) > LABEL_VALUE_MAX_LENGTH or not re.fullmatch(LABEL_VALUE_RE, value):
        raise ValueError("label values must be at most 63 letters, digits, '-', '_' or '.'")
    return value


def _check_url(value: str) -> str:
    """An http(s) URL that the rule's annotation (a Prometheus template) shows as is."""
    if not re.fullmatch("https?://[!-~]+", value) or "#" in value or "{{" in value:
        raise ValueError("must be an http(s) URL without spaces, '{{' and a '#fragment'")
    return value


def _check_image(value: str) -> str:
    if not re.fullmatch("[!-~]+", value):
        raise ValueError("must be a non-empty image reference without spaces")
    return value


def _check_release_name(value: str) -> str:
    if len(value) > RELEASE_NAME_MAX_LENGTH or not re.fullmatch(DNS1035_LABEL_RE, value):
        raise ValueError(
            f"must be a DNS-1035 label of at most {RELEASE_NAME_MAX_LENGTH} characters "
            "(lowercase letters, digits and '-', starting with a letter)"
        )
    return value


def _check_size_class_name(value: str) -> str:
    if not re.fullmatch(SIZE_CLASS_RE, value):
        raise ValueError(
            f"size class names must be 1-{SIZE_CLASS_MAX_LENGTH} letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return value


def _check_group(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError("group names must be non-empty and without surrounding whitespace")
    return value


Duration = Annotated[
    timedelta,
    PlainValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_RE}),
]
ConnectionLimit = Annotated[StrictInt, Field(ge=-1)]
"""A PostgreSQL role CONNECTION LIMIT; -1 means unlimited."""
PromqlText = Annotated[StrictStr, AfterValidator(_check_promql_text)]
SizeClassName = Annotated[StrictStr, AfterValidator(_check_size_class_name)]
GroupName = Annotated[StrictStr, AfterValidator(_check_group)]
LabelKey = Annotated[StrictStr, AfterValidator(_check_label_key)]
LabelValue = Annotated[StrictStr, AfterValidator(_check_label_value)]
RunbookUrl = Annotated[StrictStr, AfterValidator(_check_url)]


class TlsConfig(ConfigModel):
    """The API's serving certificate (a kubernetes.io/tls Secret in the release namespace)."""

    secret_name: ObjectName


class SecretObjectRef(ConfigModel):
    """A Secret the provider may `get` by name and use as shard admin credentials (shardSecrets).

    `host` and `port` bind it to the one admin endpoint its password may be sent to; unset, the
    Secret's own `host` and `port` keys do (Percona's pguser Secrets carry them); neither: unbound.
    """

    namespace: Namespace
    name: ObjectName
    host: ClientHost | None = None
    port: Port | None = None


class KeyRef(ConfigModel):
    """One key of a ConfigMap or Secret in the release namespace."""

    name: ObjectName
    key: SecretKey


class CaBundleRef(ConfigModel):
    """Where the CA certificates (PEM) for verifying shard servers come from: a ConfigMap or a Secret."""

    config_map: KeyRef | None = None
    secret: KeyRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> CaBundleRef:
        if (self.config_map is None) == (self.secret is None):
            raise ValueError("set exactly one of configMap and secret")
        return self


class ShardTlsConfig(ConfigModel):
    """How the admin connection verifies shard servers (sslmode verify-ca / verify-full).

    Without `caBundle` the system trust store is used (libpq `sslrootcert=system`, verify-full only);
    with it, the bundle is mounted into the pod and used instead (private CAs, and verify-ca).
    """

    ca_bundle: CaBundleRef | None = None
    # Shards whose admin connection may go without TLS (admin.sslmode disable, allow or prefer). Every
    # other Shard in such a mode is refused (AdminTlsRequired) before a connection is opened: without
    # TLS there is no channel binding, and a relay on the way can take the logged-in session over.
    cleartext_shards: tuple[ObjectName, ...] = ()


class SizeClass(ConfigModel):
    """One size class: the per-role connection limit a new database gets."""

    connection_limit: ConnectionLimit


class ConnectionLimitConfig(ConfigModel):
    """The connection limit of databases created without a size class."""

    default: ConnectionLimit = 10


MAX_OVERCOMMIT = 10.0


def _check_overcommit(value: object) -> float:
    """A number from 1 to MAX_OVERCOMMIT (not a string, not a boolean)."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    if not math.isfinite(number) or not 1 <= number <= MAX_OVERCOMMIT:
        raise ValueError(f"must be a ratio from 1 (no overcommit) to {MAX_OVERCOMMIT:g}")
    return float(number)


OvercommitRatio = Annotated[
    float,
    PlainValidator(_check_overcommit),
    WithJsonSchema({"type": "number", "minimum": 1, "maximum": MAX_OVERCOMMIT}),
]


class ConnectionBudgetConfig(ConfigModel):
    """What each shard keeps free besides its tenants' connection limits and the provider's own sessions,
    and by how much the tenants' limits may add up to more than the server's slots on pooled shards."""

    # Connections for roles that are neither tenants nor the provider: monitoring, the operator's own
    # users, an operator's psql. Raising it can overcommit a shard (reported, never enforced on tenants).
    reserved: Count = 5
    # Shard name -> ratio the tenants' part of its budget is multiplied by: for shards whose clients come
    # through a transaction-mode pooler, where a tenant holds a server connection only during a
    # transaction. Unnamed shards: 1 (the limits add up to at most the server's slots).
    overcommit: dict[ObjectName, OvercommitRatio] = Field(default_factory=dict)

    def overcommit_of(self, shard: str) -> float:
        return self.overcommit.get(shard, 1.0)


class DeletionProtectionConfig(ConfigModel):
    """Admission policy refusing deletes that would strand tenants (Shards with databases)."""

    enabled: StrictBool = True
    break_glass_groups: tuple[GroupName, ...] = DEFAULT_BREAK_GLASS_GROUPS


class ServiceMonitorConfig(ConfigModel):
    """The optional ServiceMonitor: extra metadata (operator selectors such as `release`) and timings."""

    enabled: StrictBool = False
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, StrictStr] = Field(default_factory=dict)
    interval: Duration = DEFAULT_SCRAPE_INTERVAL
    scrape_timeout: Duration | None = None

    @model_validator(mode="after")
    def _timings(self) -> ServiceMonitorConfig:
        if self.interval <= timedelta(0):
            raise ValueError("interval must be above 0")
        if self.scrape_timeout is not None and not timedelta(0) < self.scrape_timeout <= self.interval:
            raise ValueError("scrapeTimeout must be above 0 and at most interval")
        return self


class MetricsConfig(ConfigModel):
    """Metrics scraping."""

    service_monitor: ServiceMonitorConfig = ServiceMonitorConfig()


class PrometheusRuleConfig(ConfigModel):
    """The alert rules shipped to the central Prometheus; values go into PromQL label matchers."""

    enabled: StrictBool = False
    cluster: PromqlText = ""
    job_selector: PromqlText = ""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, StrictStr] = Field(default_factory=dict)
    runbook_base_url: RunbookUrl = DEFAULT_RUNBOOK_BASE_URL


class DashboardConfig(ConfigModel):
    """Where `dbprovider render --only dashboard --format configmap` puts the Grafana dashboard's ConfigMap."""

    namespace: Namespace | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)


class SoftDeleteConfig(ConfigModel):
    """How long a deleted tenant is kept disabled before it is dropped (0 = drop right away), whether
    consumers may undo their own delete within that window (`allowUndelete`: the API's undelete route),
    and how long a drop is remembered to be repeated after a failover that lost it (`rememberDrops`)."""

    retention: Duration = timedelta(days=7)
    allow_undelete: StrictBool = False
    # How long a completed drop stays in its Shard's status.droppedTenants, to be done again when a
    # failover lost it (reconciler.shard.dropped); 0 remembers none.
    remember_drops: Duration = timedelta(hours=1)


MAX_ROTATION_OVERLAP = timedelta(days=1)


def check_rotation_overlap(value: timedelta) -> timedelta:
    """An overlap of old and new credentials: whole seconds, at most a day (the API's and the claim's)."""
    if not timedelta(0) <= value <= MAX_ROTATION_OVERLAP or value.microseconds:
        raise ValueError("must be whole seconds from 0s to 1d")
    return value


class RotationConfig(ConfigModel):
    """Credential rotations: `defaultOverlap`, how long the old credentials keep working after a rotate
    request that names no overlap (0: they stop at once; the username then never changes)."""

    default_overlap: Annotated[Duration, AfterValidator(check_rotation_overlap)] = timedelta(0)


def _check_alert_bound(value: timedelta) -> timedelta:
    """An alert threshold: at least a minute (the rules' evaluation runs about once a minute)."""
    if value < timedelta(minutes=1):
        raise ValueError("must be at least 1m")
    return value


class MovesConfig(ConfigModel):
    """DatabaseMove: the largest database an offline move copies without `spec.force` (its writes pause
    for the whole copy, so a larger one is refused before anything starts), how long the source
    shard keeps its copy after a move for a rollback (`rollbackWindow`; 0: dropped at once), and how
    long a move may stay unfinished before the warning DBProviderMoveStuck fires (`stuckAfter`)."""

    offline_max_size: MemoryQuantity = "1Gi"
    rollback_window: Duration = timedelta(days=7)
    stuck_after: Annotated[Duration, AfterValidator(_check_alert_bound)] = timedelta(hours=6)

    @property
    def offline_max_bytes(self) -> int:
        return memory_bytes(self.offline_max_size)


class CloudberryEngineConfig(ConfigModel):
    """Support for Keldon/Cloudberry shards (grants RBAC on Keldon DatabaseClusters).

    `scalingAlertAfter`: a cluster Scaling longer than this fires the warning
    DBProviderShardScalingTooLong (scaling itself pages nobody: placement just pauses).
    """

    enabled: StrictBool = False
    scaling_alert_after: Annotated[Duration, AfterValidator(_check_alert_bound)] = timedelta(hours=1)


class ReadinessConfig(ConfigModel):
    """How a new database is proven usable before it is reported Ready (docs/operations.md, Ready means usable).

    `loginThrough: client` logs in with the database's own credentials at the Shard's client endpoint
    (what consumers are handed, e.g. pgBouncer); `admin` logs in as the tenant at the admin endpoint's
    server instead, for installs whose client endpoint the provider's pods cannot reach.
    """

    login_through: Literal["client", "admin"] = "client"


class EnginesConfig(ConfigModel):
    """Optional shard engines besides postgres."""

    cloudberry: CloudberryEngineConfig = CloudberryEngineConfig()


# -- api: the consumer API's front door --------------------------------------------------------------

MAX_API_TIMEOUT = timedelta(hours=1)


def _check_api_timeout(value: timedelta) -> timedelta:
    if not timedelta(0) < value <= MAX_API_TIMEOUT:
        raise ValueError("must be more than 0s and at most 1h")
    return value


ApiTimeout = Annotated[Duration, AfterValidator(_check_api_timeout)]


class ApiConfig(ConfigModel):
    """Deadlines and connection bounds of the consumer API's server (api/server.py, docs/api.md)."""

    header_timeout: ApiTimeout = timedelta(seconds=10)
    body_timeout: ApiTimeout = timedelta(seconds=10)
    idle_timeout: ApiTimeout = timedelta(seconds=30)
    request_timeout: ApiTimeout = timedelta(seconds=10)
    # Checked against resources.manager.limits.memory (`_connection_problems`).
    max_connections: Annotated[StrictInt, Field(ge=1)] = 1000
    max_connections_per_client: Annotated[StrictInt, Field(ge=1, le=100_000)] = 100
    max_requests_per_consumer: Annotated[StrictInt, Field(ge=1, le=1000)] = 8


MAX_WORKERS_PER_SHARD = 64  # each is a session on the shard
MAX_WORKERS_TOTAL = 1024  # each is a thread of the leading replica

# -- end of api ------------------------------------------------------------------------------------------


class InstallConfig(ConfigModel):
    """The whole install config; see the module docstring."""

    release_name: Annotated[StrictStr, AfterValidator(_check_release_name)] = DEFAULT_RELEASE_NAME
    namespace: Namespace = DEFAULT_NAMESPACE
    image: Annotated[StrictStr, AfterValidator(_check_image)] = DEFAULT_IMAGE
    replicas: Annotated[StrictInt, Field(ge=1)] = 2
    tls: TlsConfig
    shard_secrets: tuple[SecretObjectRef, ...] = ()
    shard_tls: ShardTlsConfig = Field(default=ShardTlsConfig(), alias="shardTLS")
    size_classes: dict[SizeClassName, SizeClass] = Field(default_factory=dict)
    connection_limit: ConnectionLimitConfig = ConnectionLimitConfig()
    connection_budget: ConnectionBudgetConfig = ConnectionBudgetConfig()
    deletion_protection: DeletionProtectionConfig = DeletionProtectionConfig()
    metrics: MetricsConfig = MetricsConfig()
    prometheus_rule: PrometheusRuleConfig = PrometheusRuleConfig()
    dashboard: DashboardConfig = DashboardConfig()
    soft_delete: SoftDeleteConfig = SoftDeleteConfig()
    rotation: RotationConfig = RotationConfig()
    moves: MovesConfig = MovesConfig()
    engines: EnginesConfig = EnginesConfig()
    api: ApiConfig = ApiConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    resources: ResourcesConfig = ResourcesConfig()
    sizing: SizingConfig = SizingConfig()
    # The Database controller's workers (docs/runtime.md, "Workers and lanes"): at most workersPerShard
    # on one shard's databases (and on placement), workersTotal in all.
    workers_per_shard: Annotated[StrictInt, Field(ge=1, le=MAX_WORKERS_PER_SHARD)] = 4
    workers_total: Annotated[StrictInt, Field(ge=1, le=MAX_WORKERS_TOTAL)] = 64

    @field_validator("workers_total")
    @classmethod
    def _total_covers_one_shard(cls, value: int, info: ValidationInfo) -> int:
        per_shard = info.data.get("workers_per_shard")
        if per_shard is not None and value < per_shard:
            raise ValueError(f"must be at least workersPerShard ({per_shard})")
        return value

    def resolve_connection_limit(self, size_class: str | None) -> int:
        """The connection limit for a new database: empty -> connectionLimit.default; unknown -> raise."""
        if not size_class:
            return self.connection_limit.default
        entry = self.size_classes.get(size_class)
        if entry is None:
            raise UnknownSizeClass(size_class)
        return entry.connection_limit

    def metrics_service_name(self) -> str:
        """The metrics Service `<releaseName>-metrics`; the ServiceMonitor's job label is this name."""
        return f"{self.release_name}{METRICS_SERVICE_SUFFIX}"

    def effective_job_selector(self) -> str:
        """The `job` label the alert rules select: prometheusRule.jobSelector, else the metrics Service."""
        return self.prometheus_rule.job_selector or self.metrics_service_name()

    def shard_secrets_by_namespace(self) -> dict[str, tuple[str, ...]]:
        """shardSecrets grouped for RBAC: namespace -> sorted unique Secret names (one Role each)."""
        grouped: dict[str, set[str]] = {}
        for ref in self.shard_secrets:
            grouped.setdefault(ref.namespace, set()).add(ref.name)
        return {ns: tuple(sorted(names)) for ns, names in sorted(grouped.items())}

    def may_read_admin_secret(self, namespace: str, name: str) -> bool:
        """True if the Secret is listed in shardSecrets: the only Secrets ever used as admin credentials.

        The release namespace is no exception: the provider may read other Secrets there (credentials,
        token hashes, its TLS key), and a Shard must not be able to point its admin login at them.
        """
        return any(ref.namespace == namespace and ref.name == name for ref in self.shard_secrets)

    def shard_secrets_in_release_namespace(self) -> tuple[str, ...]:
        """shardSecrets names in the release namespace (render warns: keep admin Secrets elsewhere)."""
        return tuple(sorted({ref.name for ref in self.shard_secrets if ref.namespace == self.namespace}))


def load_install_config(data: Mapping[str, Any] | None) -> InstallConfig:
    """Validate a parsed install config; raise ConfigError naming every offending key."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError((("", "the install config must be a mapping of keys to values"),))
    try:
        config = InstallConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None
    problems = _connection_problems(config)
    if problems:
        raise ConfigError(problems)
    return config


def _connection_problems(config: InstallConfig) -> tuple[tuple[str, str], ...]:
    """api.maxConnections times what a connection may cost must fit the manager's memory limit with room."""
    limit = config.resources.manager.memory_limit_bytes
    if limit is None:
        return ()
    pod, wanted = SETTINGS.pod, config.api.max_connections
    room = max(0, limit - pod.manager_room_mib * 2**20)
    most = room // pod.connection_bytes
    if wanted <= most:
        return ()
    message = (
        f"{wanted} connections of up to {pod.connection_bytes // 1024} KiB each need "
        f"{wanted * pod.connection_bytes // 2**20} MiB, more than the {room // 2**20} MiB that the pod's memory limit "
        f"of {config.resources.manager.limits.memory} (resources.manager.limits.memory) leaves beside the manager; "
        f"at most {most}"
    )
    return (("api.maxConnections", message),)


def read_install_values(path: str | Path) -> Any:
    """The parsed YAML of a values file, unvalidated (for callers that merge values before validating)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError((("", f"cannot read {path}: {type(exc).__name__}"),)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError((("", f"{path} is not valid YAML{where}"),)) from None


def load_install_config_file(path: str | Path) -> InstallConfig:
    """Read a YAML install config (a values file) and validate it."""
    return load_install_config(read_install_values(path))
