"""What `dbprovider upgrade check` reads from a live DB cluster: the install and its objects, read-only.

Everything is read with GETs (a kubeconfig that may only read is enough), and with `--shard-sql`
from each shard over an admin session that is read-only (`default_transaction_read_only`): the
catalog rows of the tenants the Databases name, and whether the server offers SCRAM at all. The
admin Secrets are read only when they are listed in shardSecrets, as the manager reads them; of those
the check keeps whether they are bound to an endpoint, never a value.
Errors carry an error class, never server text or credentials.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from domain.admin_access import EndpointBinding, OutsidePod, bound_endpoint
from domain.config import ConfigError, InstallConfig, SecretObjectRef, load_install_config
from domain.connection_budget import ServerSlots, tenant_disabled
from domain.constants import Phase
from domain.credentials import secret_values
from domain.metadata import ListPage, ObjectMeta, object_label
from domain.objects import lenient_status
from domain.resources import CONSUMERS, DATABASES, SHARDS
from domain.settings import SETTINGS
from domain.specs import ShardSpec, parse_database, parse_shard
from domain.status import DatabaseStatus
from informers import CONFIGMAPS, SECRETS, Rest
from reconciler.shard.admin import AdminPolicy, AdminRefused, AdminSecretInvalid, admin_endpoint
from reconciler.sql.errors import classify
from reconciler.sql.provisioner import server_slots
from reconciler.sql.session import connect_admin
from reconciler.sql.tenant import (
    OwnerRecord,
    OwnershipCheck,
    inspect_ownership,
    inspect_provisioning,
    validate_tenant_name,
)

APPLICATION_NAME = "dbprovider-upgrade-check"
CRDS = ("shards", "consumers", "databases")
CRD_GROUP = "db.bnerd.com"
VERSION_LABEL = "app.kubernetes.io/version"


class LiveInstallError(RuntimeError):
    """The cluster could not be read; the message names the error class only."""


@dataclass(frozen=True)
class DatabaseFact:
    """A Database object as the check needs it: name, consumer, phase, placement, tenant."""

    name: str
    uid: str
    consumer: str
    phase: str | None
    shard: str | None
    tenant: str | None
    connection_limit: int | None
    held: bool
    disabled: bool = False  # soft-deleted and its tenant disabled: it commits no connections

    @property
    def provisioned(self) -> bool:
        """Its tenant was finished once (Ready, or being deleted): what the ownership check looks at."""
        return self.phase in (Phase.READY, Phase.DELETING)


@dataclass(frozen=True)
class ShardSqlFact:
    """What one shard's admin session showed: the tenants' ownership verdicts, or why it could not."""

    tenants: dict[str, OwnershipCheck] = field(default_factory=dict)  # Database name -> verdict
    error_class: str | None = None  # the connection or the reads failed (e.g. insecure_auth_refused)
    refusal: tuple[str, str] | None = None  # (Ready reason, message): this release will not log in there
    slots: ServerSlots | None = None  # the server's connection slots, the input of its budget


@dataclass(frozen=True)
class AdminSecretFact:
    """A Secret listed in shardSecrets: whether it is bound to an endpoint (None: it could not be read)."""

    namespace: str
    name: str
    bound: bool | None
    unread: str | None = None  # why it was not read


@dataclass
class LiveInstall:
    """The install as it runs now."""

    namespace: str
    release: str
    config: InstallConfig | None
    config_problems: list[tuple[str, str]]
    config_source: str
    deployment: dict[str, Any] | None
    shards: dict[str, dict[str, Any]]
    consumers: dict[str, dict[str, Any]]
    databases: list[DatabaseFact]
    crds: dict[str, dict[str, Any]]  # plural -> the CRD (absent: not installed)
    shard_sql: dict[str, ShardSqlFact] | None = None  # None: --shard-sql was not given
    admin_secrets: list[AdminSecretFact] = field(default_factory=list)  # the config's shardSecrets

    @property
    def installed_version(self) -> str | None:
        """The release the Deployment runs (its label; 0.1.0 set none)."""
        if self.deployment is None:
            return None
        return object_label(self.deployment, VERSION_LABEL)

    def shard_spec(self, name: str) -> ShardSpec | None:
        try:
            return parse_shard(self.shards[name])
        except (KeyError, ValidationError):
            return None


def read_live_install(
    kubeconfig: str,
    namespace: str,
    release: str,
    config_file: str | None = None,
    *,
    shard_sql: bool = False,
    outside_pod: OutsidePod,
) -> LiveInstall:
    """Read the install (LiveInstallError if the cluster cannot be read at all)."""
    try:
        with kubernetes.config.new_client_from_config(config_file=kubeconfig) as client:
            rest = Rest(client)
            live = _read(rest, namespace, release, config_file)
            if live.config is not None:
                live.admin_secrets = [_admin_secret(rest, ref) for ref in live.config.shard_secrets]
            if shard_sql and live.config is not None:
                live.shard_sql = _read_shards(rest, live, outside_pod)
            return live
    except ApiException as exc:
        raise LiveInstallError(f"reading the cluster failed with HTTP {exc.status}") from None
    except (ConfigException, HTTPError, OSError, ValueError, TypeError) as exc:
        raise LiveInstallError(f"cannot read the cluster: {type(exc).__name__}") from None


def _get(rest: Rest, path: str) -> dict[str, Any] | None:
    try:
        return rest.request("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _read(rest: Rest, namespace: str, release: str, config_file: str | None) -> LiveInstall:
    config, problems, source = live_install_config(rest, namespace, release, config_file)
    deployment = _get(rest, f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}")
    crds = {}
    for plural in CRDS:
        crd = _get(rest, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{CRD_GROUP}")
        if crd is not None:
            crds[plural] = crd
    shards = _by_name(rest.list(SHARDS)) if "shards" in crds else {}
    consumers = _by_name(rest.list(CONSUMERS)) if "consumers" in crds else {}
    databases = []
    if "databases" in crds:
        databases = [_database(obj) for obj in ListPage.of(rest.list(DATABASES, namespace)).items]
    return LiveInstall(namespace, release, config, problems, source, deployment, shards, consumers, databases, crds)


def live_install_config(
    rest: Rest, namespace: str, release: str, config_file: str | None
) -> tuple[InstallConfig | None, list[tuple[str, str]], str]:
    """The install config this release will run with: the given values file, else the live ConfigMap's
    (as the running release rendered it), parsed by this release's own rules."""
    if config_file is not None:
        with open(config_file, encoding="utf-8") as handle:
            data, source = yaml.safe_load(handle), config_file
    else:
        try:
            config_map = rest.get(CONFIGMAPS, f"{release}-config", namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            raise LiveInstallError(
                f"no ConfigMap {release}-config in namespace {namespace}: not the install's release name or "
                "namespace (--release, --namespace)?"
            ) from None
        key = SETTINGS.files.in_volume(SETTINGS.files.config)
        data, source = yaml.safe_load((config_map.get("data") or {}).get(key) or "{}"), f"ConfigMap {release}-config"
    try:
        return load_install_config(data), [], source
    except ConfigError as exc:
        return None, list(exc.problems), source


def _by_name(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The objects of a LIST answer by name (parsed by whoever reads one: a bad one is still shown)."""
    return {ObjectMeta.of(obj).name: obj for obj in ListPage.of(answer).items}


def _database(obj: dict[str, Any]) -> DatabaseFact:
    """What the checks need of a Database, read leniently: an invalid spec or status still shows."""
    meta = ObjectMeta.of(obj)
    try:
        consumer = parse_database(obj).consumer
    except ValidationError:
        consumer = ""
    status = lenient_status(DatabaseStatus, obj)
    return DatabaseFact(
        name=meta.name,
        uid=meta.uid or "",
        consumer=consumer,
        phase=status.phase.value if status.phase else None,
        shard=status.shard,
        tenant=status.tenant_name,
        connection_limit=status.applied_connection_limit,
        held=meta.deleting,
        disabled=tenant_disabled(obj),
    )


def _admin_secret(rest: Rest, ref: SecretObjectRef) -> AdminSecretFact:
    """Whether the shardSecrets entry `ref` binds its Secret, else whether the Secret's own keys do."""
    entry = EndpointBinding(ref.host, ref.port)
    if entry.binds:
        return AdminSecretFact(ref.namespace, ref.name, True)
    try:
        secret = rest.get(SECRETS, ref.name, ref.namespace)
    except ApiException as exc:
        if exc.status in (403, 404):
            why = "not found" if exc.status == 404 else "not readable with this kubeconfig"
            return AdminSecretFact(ref.namespace, ref.name, None, why)
        raise
    return AdminSecretFact(ref.namespace, ref.name, bound_endpoint(entry, secret_values(secret)) is not None)


def _read_shards(rest: Rest, live: LiveInstall, outside_pod: OutsidePod) -> dict[str, ShardSqlFact]:
    """Per shard with placed databases: the ownership verdict of each tenant, read-only."""
    assert live.config is not None
    policy = AdminPolicy.from_config(live.config, outside_pod.ca_file)
    placed: dict[str, list[DatabaseFact]] = {}
    for db in live.databases:
        if db.shard and db.tenant and db.phase != Phase.DELETED:
            placed.setdefault(db.shard, []).append(db)
    facts = {}
    for name in sorted(set(placed) | set(live.shards)):
        spec = live.shard_spec(name)
        if spec is None:
            continue
        facts[name] = _read_shard(rest, name, spec, policy, outside_pod.admin_host, placed.get(name, []))
    return facts


def _read_shard(
    rest: Rest,
    name: str,
    spec: ShardSpec,
    policy: AdminPolicy,
    host_override: str | None,
    databases: list[DatabaseFact],
) -> ShardSqlFact:
    try:
        endpoint = admin_endpoint(rest, name, spec, policy, host_override)
    except AdminSecretInvalid:
        return ShardSqlFact(error_class="admin_secret_invalid")
    except AdminRefused as exc:  # this release's rules (TLS, the Secret's endpoint): no connection is made
        return ShardSqlFact(refusal=(str(exc.reason), str(exc)))
    try:
        conn = connect_admin(endpoint, application_name=APPLICATION_NAME)
    except Exception as exc:  # noqa: BLE001 - classified, never echoed
        return ShardSqlFact(error_class=classify(exc, "check").error_class)
    verdicts = {}
    with contextlib.closing(conn):
        try:
            conn.execute("SET default_transaction_read_only = on")  # whatever runs below cannot write
            slots = server_slots(conn)
            for db in databases:
                assert db.tenant is not None
                validate_tenant_name(db.tenant)
                owner = OwnerRecord(db.consumer or "-", db.uid)
                if db.provisioned:
                    verdicts[db.name] = inspect_ownership(conn, db.tenant, owner, db.connection_limit)
                else:
                    verdicts[db.name] = inspect_provisioning(conn, db.tenant, owner)
        except Exception as exc:  # noqa: BLE001
            return ShardSqlFact(verdicts, classify(exc, "check").error_class)
    return ShardSqlFact(verdicts, slots=slots)
