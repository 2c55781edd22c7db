"""Render the install's Kubernetes manifests from the jinja2 templates in infra/templates/.

Both the Pulumi program (infra.component) and `dbprovider render` call these functions, so a GitOps
landscape repo and `pulumi up` get the very same objects. Pure: no Pulumi, no Kubernetes client.

    render_manifests(config)        -> the DB cluster's objects, CRDs first
    render_prometheus_rule(config)  -> the PrometheusRule for the central Prometheus
    render_agent_manifests(agent)   -> the consumer agent's objects (its PrometheusRule if enabled)
    render_agent_prometheus_rule(agent) -> the agent's alert rules, for the consumer cluster's Prometheus
    rule_groups(rule)               -> the same rules as a plain Prometheus rule file
    prometheus_rule_warnings(config) -> what the user should be told (e.g. no per-cluster absence)
    install_warnings(config)        -> the same for the DB cluster's objects (e.g. admin Secrets placement)
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from collections.abc import Iterable
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from domain.agent_config import AGENT_NAME, AgentInstallConfig
from domain.config import InstallConfig, format_duration
from domain.constants import (
    CLAIM_NAMES,
    FINALIZER_SHARD_DATABASES,
    GROUP,
    KELDON_GROUP,
    KELDON_PLURAL_DATABASE_CLUSTERS,
    KINDS,
    LABEL_PROVISIONED_SERVICE,
    SERVED_VERSIONS,
    SINGULAR_CONSUMER,
    SINGULAR_DATABASE,
    SINGULAR_DATABASE_MOVE,
    SINGULAR_SHARD,
    STORAGE_VERSION,
    ShardReason,
)
from domain.metadata import ObjectMeta
from domain.naming import DNS1123_LABEL_RE, label_value
from domain.settings import SETTINGS
from domain.version import __version__
from infra.crds import CLAIM_VERSIONS, claim_schema, crd_schemas

# A cloudberry cluster that is Scaling is planned work, not an outage: DBProviderShardNotReady leaves
# it to DBProviderShardScalingTooLong.
SCALING_REASON = ShardReason.CLUSTER_SCALING.value

# Package data (pyproject.toml): found next to this module in a checkout, a wheel and the image alike.
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
# The rendered templates are parsed back with libyaml's safe loader when PyYAML has it (its wheels do): the
# pure-Python one took 60 of a render's 75 ms, mostly on the CRDs' schemas. The same safe constructors either way.
_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MANIFEST_TEMPLATES = (
    "crds.yaml.j2",
    "serviceaccount.yaml.j2",
    "rbac.yaml.j2",
    "configmap.yaml.j2",
    "services.yaml.j2",
    "deployment.yaml.j2",
    "admission-policy.yaml.j2",
    "servicemonitor.yaml.j2",
)
PROMETHEUS_RULE_TEMPLATE = "prometheusrule.yaml.j2"

LABEL_CLUSTER = f"{GROUP}/cluster"
LABEL_VERSION = "app.kubernetes.io/version"
METRICS_COMPONENT = {"app.kubernetes.io/component": "metrics"}
WARNING_NO_CLUSTER = (
    "prometheusRule.cluster is not set: the alert rules match every cluster that reports this job, and "
    "DBProviderDown cannot notice one cluster's provider vanishing. Set prometheusRule.cluster to the "
    "value of this DB cluster's `cluster` external label."
)


def _json(value: Any) -> str:
    """A JSON literal, which YAML reads back unchanged (used for every value from the config)."""
    return json.dumps(value, ensure_ascii=False)


@lru_cache(maxsize=1)
def _environment(templates_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["json"] = _json
    return env


def cel_string(value: str) -> str:
    """A CEL double-quoted string literal (JSON escaping is a subset of CEL's)."""
    return json.dumps(value, ensure_ascii=False)


# Install config keys added since the release a rolling update comes from (0.1.0), left out of the
# rendered config while they hold their default (the manager resolves the same default): a pod mounts
# the ConfigMap by name, so an old pod that restarts mid-rollout reads this release's config, and 0.1.0
# refuses keys it does not know. From 0.2.0 on the manager ignores unknown keys, so this list ends
# with the release after 0.2.0 (tests/upgrade/test_config_compat.py holds it to account). A path is
# key names by alias; "*" stands for every item of a list.
ADDED_SINCE_PREVIOUS_RELEASE: tuple[tuple[str, ...], ...] = (
    ("api", "requestTimeout"),
    ("api", "maxRequestsPerConsumer"),
    ("shardTLS", "cleartextShards"),
    ("shardSecrets", "*", "host"),
    ("shardSecrets", "*", "port"),
    ("connectionBudget",),
    ("readiness",),
    ("engines", "cloudberry", "scalingAlertAfter"),
    ("workersPerShard",),
    ("workersTotal",),
    ("resources",),
    ("sizing",),
    ("softDelete", "allowUndelete"),
    ("softDelete", "rememberDrops"),
    ("moves",),
    ("rotation",),
)


def config_yaml(config: InstallConfig) -> str:
    """The install config with every default resolved, as the manager reads it from its ConfigMap
    (keys added since the previous release only when they differ from their default)."""
    data = config.model_dump(by_alias=True, mode="json")
    for path in ADDED_SINCE_PREVIOUS_RELEASE:
        _drop_if_default(data, path, _field_at(InstallConfig, path))
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _field_at(model: type[BaseModel], path: tuple[str, ...]) -> FieldInfo:
    """The model field at `path` (aliases; "*" an item of a list or tuple)."""
    annotation: Any = model
    field: FieldInfo | None = None
    for part in path:
        if part == "*":
            annotation = typing.get_args(annotation)[0]
            continue
        field = {f.alias or name: f for name, f in annotation.model_fields.items()}[part]
        annotation = field.annotation
    assert field is not None
    return field


def _drop_if_default(node: Any, path: tuple[str, ...], field: FieldInfo) -> None:
    """Remove the value at `path` where it is the field's default (compared as parsed values, so
    "10s" equals timedelta(seconds=10))."""
    head, rest = path[0], path[1:]
    if head == "*":
        for item in node if isinstance(node, list) else ():
            _drop_if_default(item, rest, field)
    elif not isinstance(node, dict) or head not in node:
        return
    elif rest:
        _drop_if_default(node[head], rest, field)
    else:
        adapter: TypeAdapter[Any] = TypeAdapter(field.rebuild_annotation())
        parsed = adapter.validate_python(node[head])
        if parsed == field.get_default(call_default_factory=True):
            del node[head]


def common_labels(config: InstallConfig) -> dict[str, str]:
    """On every object: the selector labels, the product and the release version that rendered it
    (never in a selector: a selector cannot change, the version does with every upgrade)."""
    return {**selector_labels(config), "app.kubernetes.io/part-of": "dbprovider", LABEL_VERSION: __version__}


def selector_labels(config: InstallConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": "dbprovider", "app.kubernetes.io/instance": config.release_name}


def prometheus_rule_name(config: InstallConfig) -> str:
    """`<release>-<cluster>` (one rule object per DB cluster at the central Prometheus), else `<release>`."""
    cluster = config.prometheus_rule.cluster
    if not cluster:
        return config.release_name
    readable = cluster.lower()
    if re.fullmatch(DNS1123_LABEL_RE, readable) and readable == cluster and len(readable) <= 63:
        return f"{config.release_name}-{readable}"
    cleaned = re.sub("[^a-z0-9-]+", "-", readable).strip("-")[:40].strip("-")
    digest = hashlib.sha256(cluster.encode("utf-8")).hexdigest()[:10]
    return f"{config.release_name}-{cleaned}-{digest}" if cleaned else f"{config.release_name}-{digest}"


def job_matcher(config: InstallConfig) -> str:
    return f'job="{config.effective_job_selector()}"'


def promql_selector(config: InstallConfig) -> str:
    """The label matchers every alert expression uses: the job, and the cluster when configured."""
    matchers = [job_matcher(config)]
    if config.prometheus_rule.cluster:
        matchers.append(f'cluster="{config.prometheus_rule.cluster}"')
    return ", ".join(matchers)


def _reasons_template(config: InstallConfig, series: str, matchers: str, counts: bool) -> str:
    """A Prometheus template listing the `reason` labels (with values if `counts`) of `series` for the
    alert's cluster and shard plus `matchers`: ", "-separated, each after a space."""
    job = job_matcher(config).replace("%", "%%")  # printf; a backtick is refused by the config
    query = series.format(selector=f'{job}, cluster="%s", shard="%s", {matchers}')
    value = " ({{ $s.Value }})" if counts else ""
    return (
        "{{ range $i, $s := printf `" + query + "` $labels.cluster $labels.shard | query | sortByLabel `reason` }}"
        "{{ if $i }},{{ end }} {{ $s.Labels.reason }}" + value + "{{ end }}"
    )


def provisioning_reasons_template(config: InstallConfig) -> str:
    """The Ready reasons (and counts) of the Provisioning databases of the alert's cluster and shard,
    for DBProviderDatabaseStuckProvisioning's description."""
    series = "sum by (reason) (max by (cluster, shard, phase, reason) (dbprovider_databases{{{selector}}}))"
    return _reasons_template(config, series, 'phase="Provisioning"', counts=True)


def shard_reasons_template(config: InstallConfig) -> str:
    """The Ready reason(s) of the alert's shard now, for DBProviderShardNotReady's description: the
    alert itself is per shard (no reason label), so a reason that changes mid-outage keeps its clock."""
    series = "max by (reason) (dbprovider_shard_ready{{{selector}}} == 0)"
    return _reasons_template(config, series, f'reason!="{SCALING_REASON}"', counts=False)


def failed_reasons_template(config: InstallConfig) -> str:
    """The Ready reasons (and counts) of the alert's shard's Failed databases, for DBProviderDatabaseFailed."""
    series = "max by (reason) (dbprovider_databases{{{selector}}} > 0)"
    return _reasons_template(config, series, 'phase="Failed"', counts=True)


def prometheus_duration(seconds: float) -> str:
    """A Prometheus duration ("10m", "15s", "500ms") for a number of seconds, rounded to milliseconds."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError("durations must be positive")
    if millis % 1000:
        return f"{millis}ms"
    return format_duration(timedelta(seconds=millis // 1000))


def _timings(time_scale: int) -> dict[str, Any]:
    """`dur` and `secs` for the rule template: durations divided by the test-only time scale."""
    if time_scale < 1:
        raise ValueError("the time scale must be at least 1")

    def secs(seconds: float) -> float | int:
        scaled = seconds / time_scale
        return int(scaled) if scaled == int(scaled) else round(scaled, 3)

    return {"dur": lambda seconds: prometheus_duration(seconds / time_scale), "secs": secs}


def _context(config: InstallConfig, time_scale: int = 1) -> dict[str, Any]:
    text = config_yaml(config)
    labels = common_labels(config)
    groups = config.deletion_protection.break_glass_groups
    if groups:
        listed = ", ".join(cel_string(g) for g in groups)
        break_glass = f"!request.userInfo.groups.exists(g, g in [{listed}])"
    else:
        break_glass = "true"
    shard_secret_roles = {
        ns: names for ns, names in config.shard_secrets_by_namespace().items() if ns != config.namespace
    }
    rule_labels = {**config.prometheus_rule.labels, **labels}
    monitor = config.metrics.service_monitor
    if config.prometheus_rule.cluster:
        rule_labels[LABEL_CLUSTER] = label_value(config.prometheus_rule.cluster)
    return {
        "config": config,
        "release": config.release_name,
        "namespace": config.namespace,
        "service_account": config.release_name,
        "config_map": f"{config.release_name}-config",
        "config_yaml": text,
        "config_checksum": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "metrics_service": config.metrics_service_name(),
        "deletion_policy": f"{config.release_name}-shard-deletion-protection",
        "break_glass_condition": break_glass,
        "shard_finalizer": FINALIZER_SHARD_DATABASES,
        "provider_user": f"system:serviceaccount:{config.namespace}:{config.release_name}",
        "shard_secret_roles": shard_secret_roles,
        "common_labels": labels,
        "selector_labels": selector_labels(config),
        "metrics_labels": {**labels, **METRICS_COMPONENT},
        # The ServiceMonitor's selector: no version in it (it would stop matching during a rollout).
        "metrics_selector": {**selector_labels(config), **METRICS_COMPONENT},
        "rule_labels": rule_labels,
        "rule_name": prometheus_rule_name(config),
        "sel": promql_selector(config),
        "job_sel": job_matcher(config),
        "provisioning_reasons": provisioning_reasons_template(config),
        "shard_reasons": shard_reasons_template(config),
        "failed_reasons": failed_reasons_template(config),
        "scaling_reason": SCALING_REASON,
        "scaling_alert_after": format_duration(config.engines.cloudberry.scaling_alert_after),
        "move_stuck_after": format_duration(config.moves.stuck_after),
        "runbook": config.prometheus_rule.runbook_base_url,
        **_timings(time_scale),
        "service_monitor_labels": {**monitor.labels, **labels},
        "service_monitor_interval": format_duration(monitor.interval),
        "service_monitor_timeout": format_duration(monitor.scrape_timeout) if monitor.scrape_timeout else "",
        "group": GROUP,
        "versions": [{"name": version, "storage": version == STORAGE_VERSION} for version in SERVED_VERSIONS],
        "plurals": {key: names.plural for key, names in KINDS.items()},
        "crd_kinds": [
            {"key": key, "kind": names.kind, "plural": names.plural, "singular": names.singular, "scope": scope}
            for key, names, scope in (
                (SINGULAR_SHARD, KINDS[SINGULAR_SHARD], "Cluster"),
                (SINGULAR_CONSUMER, KINDS[SINGULAR_CONSUMER], "Cluster"),
                (SINGULAR_DATABASE, KINDS[SINGULAR_DATABASE], "Namespaced"),
                (SINGULAR_DATABASE_MOVE, KINDS[SINGULAR_DATABASE_MOVE], "Namespaced"),
            )
        ],
        "schemas": crd_schemas(),
        "keldon": {"group": KELDON_GROUP, "plural": KELDON_PLURAL_DATABASE_CLUSTERS},
        # Ports, files, environment and probes the manager's defaults read too: one source, domain.settings.
        "ports": SETTINGS.ports,
        "files": SETTINGS.files,
        "env": SETTINGS.env,
        "probes": SETTINGS.probes,
        # resources.manager: the keys set (a key set to null is left out of the Deployment)
        "manager_resources": config.resources.manager.container_resources(),
        "termination": SETTINGS.termination,
        "uid": SETTINGS.run_as_uid,
    }


def _render(names: Iterable[str], config: InstallConfig, time_scale: int = 1) -> list[dict[str, Any]]:
    env = _environment(TEMPLATES_DIR)
    context = _context(config, time_scale)
    objects: list[dict[str, Any]] = []
    for name in names:
        text = env.get_template(name).render(context)
        try:
            documents = list(yaml.load_all(text, Loader=_LOADER))
        except yaml.YAMLError as exc:  # a template bug, not a user error
            raise RuntimeError(f"template {name} rendered invalid YAML: {exc}") from exc
        objects.extend(doc for doc in documents if doc)
    return objects


def render_manifests(config: InstallConfig) -> list[dict[str, Any]]:
    """Every object of the install in the DB cluster, CRDs first (the PrometheusRule is separate)."""
    return _render(MANIFEST_TEMPLATES, config)


AGENT_TEMPLATE = "agent.yaml.j2"
AGENT_RULE_TEMPLATE = "agent-prometheusrule.yaml.j2"
AGENT_TOKEN_DIR = "/var/run/dbprovider-agent/token"
AGENT_CA_DIR = "/var/run/dbprovider-agent/ca"


def agent_args(config: AgentInstallConfig) -> list[str]:
    """The agent container's arguments (after `dbprovider`)."""
    args = [
        "agent",
        "--provider-url",
        config.provider_url,
        "--token-file",
        f"{AGENT_TOKEN_DIR}/token",
        "--poll-interval",
        str(int(config.poll_interval.total_seconds())),
        "--lease-name",
        config.name,
        "--metrics-port",
        str(SETTINGS.ports.agent),
    ]
    if config.ca_secret:
        args += ["--ca-file", f"{AGENT_CA_DIR}/ca.crt"]
    if config.watch_namespace:
        args += ["--watch-namespace", config.watch_namespace]
    return args


def render_agent_manifests(config: AgentInstallConfig) -> list[dict[str, Any]]:
    """The consumer agent's objects for one consumer cluster, its CRD first (`dbprovider render --agent`)."""
    labels = {
        "app.kubernetes.io/name": AGENT_NAME,
        "app.kubernetes.io/instance": config.name,
        "app.kubernetes.io/version": label_value(__version__),
        "app.kubernetes.io/managed-by": "dbprovider",
    }
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    monitor = config.metrics.service_monitor
    context = {
        "config": config,
        "group": GROUP,
        "claim": CLAIM_NAMES,
        "claim_versions": CLAIM_VERSIONS,
        "claim_schema": claim_schema(),
        "labels": labels,
        "selector": selector,
        "args": agent_args(config),
        "token_dir": AGENT_TOKEN_DIR,
        "ca_dir": AGENT_CA_DIR,
        "pod_namespace_env": SETTINGS.env.pod_namespace,
        "uid": SETTINGS.run_as_uid,
        "provisioned_service": LABEL_PROVISIONED_SERVICE,
        "port": SETTINGS.ports.agent,
        "probes": SETTINGS.probes,
        "resources": config.resources.container_resources(),
        "metrics_service": config.metrics_service_name(),
        "metrics_labels": {**labels, **METRICS_COMPONENT},
        # The ServiceMonitor's selector: no version in it (it would stop matching during a rollout).
        "metrics_selector": {**selector, **METRICS_COMPONENT},
        "monitor_interval": format_duration(monitor.interval),
        "monitor_timeout": format_duration(monitor.scrape_timeout) if monitor.scrape_timeout else "",
    }
    text = _environment(TEMPLATES_DIR).get_template(AGENT_TEMPLATE).render(context)
    objects = [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]
    if config.prometheus_rule.enabled:
        objects.append(render_agent_prometheus_rule(config))
    return objects


def _agent_reasons_template(config: AgentInstallConfig, condition: str) -> str:
    """A Prometheus template listing the reasons (and claim counts) of the claims whose `condition` is
    False, as the agent's replicas report them: ", "-separated, each after a space."""
    selector = f'job="{config.effective_job_selector()}", type="{condition}", status="False"'
    query = f"max by (reason) (dbprovider_agent_claim_conditions{{{selector}}})"
    return (
        "{{ range $i, $s := query `" + query + "` | sortByLabel `reason` }}"
        "{{ if $i }},{{ end }} {{ $s.Labels.reason }} ({{ $s.Value }}){{ end }}"
    )


def render_agent_prometheus_rule(config: AgentInstallConfig, time_scale: int = 1) -> dict[str, Any]:
    """The agent's PrometheusRule, for the consumer cluster's Prometheus (`--format rules`: rule_groups).

    `time_scale` is for tests only, as for render_prometheus_rule."""
    rule = config.prometheus_rule
    context = {
        "config": config,
        "rule_labels": {**rule.labels, "app.kubernetes.io/name": AGENT_NAME, "app.kubernetes.io/instance": config.name},
        "sel": f'job="{config.effective_job_selector()}"',
        "runbook": rule.runbook_base_url,
        "unreachable_after": format_duration(rule.provider_unreachable_after),
        "not_ready_after": format_duration(rule.claim_not_ready_after),
        "unreachable_reasons": _agent_reasons_template(config, "ProviderReachable"),
        "not_ready_reasons": _agent_reasons_template(config, "Ready"),
        **_timings(time_scale),
    }
    text = _environment(TEMPLATES_DIR).get_template(AGENT_RULE_TEMPLATE).render(context)
    (document,) = [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]
    return dict(document)


def render_prometheus_rule(config: InstallConfig, time_scale: int = 1) -> dict[str, Any]:
    """The PrometheusRule for the central Prometheus (rendered whether or not prometheusRule.enabled).

    `time_scale` is for tests only: every `for:`, range window and age threshold is divided by it, so a
    real Prometheus shows the alerts within seconds (`dbprovider render --test-time-scale`).
    """
    (rule,) = _render((PROMETHEUS_RULE_TEMPLATE,), config, time_scale)
    return rule


def prometheus_rule_warnings(config: InstallConfig) -> list[str]:
    """Warnings to show when the rule is rendered or deployed."""
    if config.prometheus_rule.enabled and not config.prometheus_rule.cluster:
        return [WARNING_NO_CLUSTER]
    return []


def install_warnings(config: InstallConfig) -> list[str]:
    """Warnings to show when the DB cluster's objects are rendered or deployed."""
    inside = config.shard_secrets_in_release_namespace()
    if not inside:
        return []
    return [
        f"shardSecrets lists {', '.join(inside)} in the release namespace {config.namespace}: the provider "
        "can read every Secret there (credentials, token hashes, its TLS key), so keep shard admin Secrets "
        "in a namespace of their own, where it may get exactly the listed names"
    ]


def rule_groups(rule: dict[str, Any]) -> dict[str, Any]:
    """The rule file Prometheus (and promtool) reads: the PrometheusRule's spec."""
    return {"groups": rule["spec"]["groups"]}


def object_key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name) of a manifest."""
    meta = ObjectMeta.model_validate(obj["metadata"])
    return (obj["apiVersion"], obj["kind"], meta.namespace or "", meta.name)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the config file, PromQL) as literal blocks, so the YAML reads like the source."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(objects: Iterable[dict[str, Any]]) -> str:
    """Multi-document YAML, one `---` per object, keys in template order."""
    return "".join(
        "---\n"
        + yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)
        for obj in objects
    )
