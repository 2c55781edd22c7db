"""`dbprovider render` and the rendered objects: what a landscape repo and the central Prometheus get."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from dbprovider.cli import main
from domain.config import load_install_config
from domain.constants import SHARD_CA_FILE
from domain.settings import SETTINGS
from domain.version import __version__
from infra.render import (
    TEMPLATES_DIR,
    WARNING_NO_CLUSTER,
    _environment,
    config_yaml,
    render_manifests,
    render_prometheus_rule,
)

API_PORT, METRICS_PORT, CONFIG_PATH = SETTINGS.ports.api, SETTINGS.ports.metrics, SETTINGS.files.config
REPO_ROOT = Path(__file__).resolve().parents[2]
VALUES: dict[str, Any] = {
    "releaseName": "dbp",
    "namespace": "databases",
    "tls": {"secretName": "dbp-tls"},
    "shardSecrets": [
        {"namespace": "pg-a", "name": "pg-a-provisioner"},
        {"namespace": "pg-a", "name": "pg-a2-provisioner"},
        {"namespace": "databases", "name": "local-provisioner"},
    ],
    "sizeClasses": {"small": {"connectionLimit": 5}},
    "prometheusRule": {"enabled": True, "cluster": "eu-1"},
}


def values(**changes: Any) -> dict[str, Any]:
    return {**VALUES, **changes}


def write_values(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def render_cli(tmp_path: Path, data: dict[str, Any], *args: str, capsys: Any) -> tuple[int, str, str]:
    code = main(["render", "--config", str(write_values(tmp_path, data)), *args])
    out, err = capsys.readouterr()
    return code, out, err


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    return found


OBJECTS = render_manifests(load_install_config(VALUES))


# --- the command ---------------------------------------------------------------------------------------


def test_render_writes_the_manifests_crds_first(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(tmp_path, VALUES, capsys=capsys)
    assert code == 0, err
    documents = list(yaml.safe_load_all(out))
    assert documents == OBJECTS
    assert [d["kind"] for d in documents[:4]] == ["CustomResourceDefinition"] * 4
    assert "PrometheusRule" not in {d["kind"] for d in documents}
    # VALUES lists an admin Secret in the release namespace: the one warning.
    assert err == (
        "dbprovider render: warning: shardSecrets lists local-provisioner in the release namespace databases: "
        "the provider can read every Secret there (credentials, token hashes, its TLS key), so keep shard "
        "admin Secrets in a namespace of their own, where it may get exactly the listed names\n"
    )


def test_no_warning_for_admin_secrets_outside_the_release_namespace(tmp_path: Path, capsys: Any) -> None:
    data = values(shardSecrets=[s for s in VALUES["shardSecrets"] if s["namespace"] != "databases"])
    code, _, err = render_cli(tmp_path, data, capsys=capsys)
    assert code == 0 and err == ""
    code, _, err = render_cli(tmp_path, VALUES, "--only", "prometheusrule", capsys=capsys)
    assert code == 0 and err == ""  # the rule alone is not about shard Secrets


def test_render_only_prometheusrule_is_the_rule_alone(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(tmp_path, VALUES, "--only", "prometheusrule", capsys=capsys)
    assert code == 0, err
    (rule,) = list(yaml.safe_load_all(out))
    assert rule == render_prometheus_rule(load_install_config(VALUES))
    assert rule["kind"] == "PrometheusRule" and rule["metadata"]["name"] == "dbp-eu-1"


def test_render_to_a_file(tmp_path: Path, capsys: Any) -> None:
    target = tmp_path / "out" / "dbprovider.yaml"
    target.parent.mkdir()
    code, out, _ = render_cli(tmp_path, VALUES, "--output", str(target), capsys=capsys)
    assert code == 0 and out == ""
    assert list(yaml.safe_load_all(target.read_text())) == OBJECTS


def test_warning_on_stderr_when_the_rule_has_no_cluster(tmp_path: Path, capsys: Any) -> None:
    data = values(prometheusRule={"enabled": True})
    for args in ((), ("--only", "prometheusrule")):
        code, out, err = render_cli(tmp_path, data, *args, capsys=capsys)
        assert code == 0
        assert WARNING_NO_CLUSTER in err
        assert WARNING_NO_CLUSTER not in out  # stdout is YAML only
        assert all(isinstance(doc, dict) for doc in yaml.safe_load_all(out))


def test_rule_without_enabled_is_refused_naming_the_key(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(
        tmp_path, values(prometheusRule={"cluster": "eu-1"}), "--only", "prometheusrule", capsys=capsys
    )
    assert code == 2 and out == ""
    assert "prometheusRule.enabled" in err


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (values(prometheusRule={"enabled": True, "cluster": 'eu"1'}), "prometheusRule.cluster"),
        (values(prometheusRule={"enabled": True, "cluster": "eu\\1"}), "prometheusRule.cluster"),
        (values(prometheusRule={"enabled": True, "cluster": "eu\n1"}), "prometheusRule.cluster"),
        (values(prometheusRule={"enabled": True, "jobSelector": 'job"'}), "prometheusRule.jobSelector"),
        (values(prometheusRule={"enabled": True, "jobSelector": "a\nb"}), "prometheusRule.jobSelector"),
        (values(tls={}), "tls.secretName"),
        ({k: v for k, v in VALUES.items() if k != "tls"}, "tls"),
        (values(replicas=0), "replicas"),
        (values(shardSecrets=[{"namespace": "pg-a"}]), "shardSecrets[0].name"),
        (values(sizeClasses={"small": {"connectionLimit": "ten"}}), "sizeClasses.small.connectionLimit"),
        (values(deletionProtection={"enable": True}), "deletionProtection.enable"),
        (values(softDelete={"retention": "a week"}), "softDelete.retention"),
        (values(softDelete={"allowUndelete": "true"}), "softDelete.allowUndelete"),
        (
            values(prometheusRule={"enabled": True, "labels": {"bad key": "x"}}),
            "prometheusRule.labels['bad key'] (key)",
        ),
        (values(prometheusRule={"enabled": True, "labels": {"release": "a b"}}), "prometheusRule.labels.release"),
        (values(prometheusRule={"enabled": True, "runbookBaseUrl": "wiki/page"}), "prometheusRule.runbookBaseUrl"),
        (values(prometheusRule={"enabled": True, "runbookBaseUrl": "https://x/#a"}), "prometheusRule.runbookBaseUrl"),
        (values(metrics={"serviceMonitor": {"labels": {"-x": "y"}}}), "metrics.serviceMonitor.labels.-x (key)"),
        (values(metrics={"serviceMonitor": {"annotations": {"a": 1}}}), "metrics.serviceMonitor.annotations.a"),
        (values(metrics={"serviceMonitor": {"interval": "often"}}), "metrics.serviceMonitor.interval"),
        (values(metrics={"serviceMonitor": {"interval": "0"}}), "metrics.serviceMonitor"),
        (values(metrics={"serviceMonitor": {"interval": "30s", "scrapeTimeout": "1m"}}), "metrics.serviceMonitor"),
    ],
)
@pytest.mark.parametrize("only", ["manifests", "prometheusrule"])
def test_invalid_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: Any, data: dict[str, Any], key: str, only: str
) -> None:
    code, out, err = render_cli(tmp_path, data, "--only", only, capsys=capsys)
    assert code == 2
    assert out == ""
    assert f"{key}:" in err
    assert "Traceback" not in err


def test_unreadable_or_broken_config_file(tmp_path: Path, capsys: Any) -> None:
    assert main(["render", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("tls: [unclosed\n")
    assert main(["render", "--config", str(broken)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_the_console_script_renders(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "dbprovider"
    path = write_values(tmp_path, values(prometheusRule={"enabled": True}))
    result = subprocess.run(
        [str(script), "render", "--config", str(path), "--only", "prometheusrule", "-o", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)] == ["PrometheusRule"]
    assert "prometheusRule.cluster is not set" in result.stderr


# --- templates -----------------------------------------------------------------------------------------


def test_templates_use_strict_undefined(tmp_path: Path) -> None:
    env = _environment(TEMPLATES_DIR)
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("name: {{ not_defined }}").render({})


# --- the Deployment ------------------------------------------------------------------------------------


def test_deployment() -> None:
    deployment = one(OBJECTS, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["dbprovider"]
    assert container["args"] == ["manager", "--config", CONFIG_PATH]
    assert container["image"] == f"ghcr.io/bnerd/dbprovider:{__version__}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": API_PORT, "metrics": METRICS_PORT}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "dbp"
    (config_volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    sources = config_volume["projected"]["sources"]
    assert sources[0]["configMap"]["name"] == "dbp-config"
    assert sources[1]["secret"]["name"] == "dbp-tls"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == str(Path(CONFIG_PATH).parent)


@pytest.mark.parametrize("source", ["configMap", "secret"])
def test_the_shard_ca_bundle_is_mounted_where_the_manager_reads_it(source: str) -> None:
    objects = render_manifests(
        load_install_config(values(shardTLS={"caBundle": {source: {"name": "shard-ca", "key": "bundle.pem"}}}))
    )
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (config_volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    bundle = config_volume["projected"]["sources"][2]
    assert bundle == {source: {"name": "shard-ca", "items": [{"key": "bundle.pem", "path": "shard-ca/ca.crt"}]}}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "config"]
    assert f"{mount['mountPath']}/shard-ca/ca.crt" == SHARD_CA_FILE
    without = one(OBJECTS, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert [len(v["projected"]["sources"]) for v in without if v["name"] == "config"] == [2]


def test_replicas_from_config() -> None:
    objects = render_manifests(load_install_config(values(replicas=3)))
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    single = render_manifests(load_install_config(values(replicas=1)))
    assert not by_kind(single, "PodDisruptionBudget")


def test_a_config_change_rolls_the_pods_and_reaches_the_manager() -> None:
    def checksum(data: dict[str, Any]) -> str:
        deployment = one(render_manifests(load_install_config(data)), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum(VALUES) == checksum(dict(VALUES))
    assert checksum(VALUES) != checksum(values(sizeClasses={"small": {"connectionLimit": 6}}))
    config_map = one(OBJECTS, "ConfigMap")
    assert load_install_config(yaml.safe_load(config_map["data"]["config.yaml"])) == load_install_config(VALUES)
    assert config_map["data"]["config.yaml"] == config_yaml(load_install_config(VALUES))


def test_allowing_consumers_to_undelete_reaches_the_managers_config() -> None:
    default = yaml.safe_load(one(OBJECTS, "ConfigMap")["data"]["config.yaml"])
    assert "allowUndelete" not in default["softDelete"]  # left out while off: the previous release refuses it
    assert load_install_config(default).soft_delete.allow_undelete is False
    allowed = one(render_manifests(load_install_config(values(softDelete={"allowUndelete": True}))), "ConfigMap")
    assert load_install_config(yaml.safe_load(allowed["data"]["config.yaml"])).soft_delete.allow_undelete is True


def test_services_and_service_monitor() -> None:
    api = one(OBJECTS, "Service", "dbp")
    assert api["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    metrics = one(OBJECTS, "Service", "dbp-metrics")
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert not by_kind(OBJECTS, "ServiceMonitor")  # off by default
    objects = render_manifests(load_install_config(values(metrics={"serviceMonitor": {"enabled": True}})))
    monitor = one(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics["metadata"]["labels"].items()
    assert not selector.items() <= api["metadata"]["labels"].items()  # only the metrics Service
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
    # prometheusRule.cluster is set: the scrape itself stores `cluster` (server-mode Prometheus).
    assert monitor["spec"]["endpoints"][0]["relabelings"] == [
        {"action": "replace", "targetLabel": "cluster", "replacement": "eu-1"}
    ]
    assert "scrapeTimeout" not in monitor["spec"]["endpoints"][0]
    assert "annotations" not in monitor["metadata"]


def test_service_monitor_extra_labels_annotations_and_timings() -> None:
    monitor_values = {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack", "app.kubernetes.io/instance": "not-ours"},
        "annotations": {"example.com/owner": "team db"},
        "interval": "15s",
        "scrapeTimeout": "10s",
    }
    objects = render_manifests(load_install_config(values(metrics={"serviceMonitor": monitor_values})))
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "dbp"  # the selector labels stay ours
    assert monitor["metadata"]["annotations"] == {"example.com/owner": "team db"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    unscoped = values(metrics={"serviceMonitor": monitor_values}, prometheusRule={"enabled": True})
    (endpoint,) = one(render_manifests(load_install_config(unscoped)), "ServiceMonitor")["spec"]["endpoints"]
    assert "relabelings" not in endpoint


def test_render_only_prometheusrule_format_rules_is_a_plain_rule_file(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(tmp_path, VALUES, "--only", "prometheusrule", "--format", "rules", capsys=capsys)
    assert code == 0, err
    (document,) = yaml.safe_load_all(out)
    assert list(document) == ["groups"]
    assert document["groups"] == render_prometheus_rule(load_install_config(VALUES))["spec"]["groups"]


def test_a_format_of_another_kind_of_output_is_refused(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(tmp_path, VALUES, "--only", "manifests", "--format", "rules", capsys=capsys)
    assert (code, out) == (2, "")
    assert "--format rules" in err


def test_render_only_dashboard_as_json_and_as_a_sidecar_configmap(tmp_path: Path, capsys: Any) -> None:
    code, out, err = render_cli(tmp_path, VALUES, "--only", "dashboard", capsys=capsys)
    assert code == 0, err
    dashboard = json.loads(out)
    assert dashboard["uid"] == "dbprovider"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "cluster", "shard"}
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for family in (
        "dbprovider_databases{",
        "dbprovider_shard_ready",
        "dbprovider_shard_databases",
        "dbprovider_shard_max_databases",
        "dbprovider_database_provisioning_oldest_seconds",
        "dbprovider_databases_deletion_held",
        "dbprovider_databases_connection_limit_drift",
        "dbprovider_database_workers_in_flight",
        "dbprovider_database_queue_depth",
        "dbprovider_reconcile_errors_total",
        "dbprovider_reconcile_conflicts_total",
        "dbprovider_api_requests_total",
        "dbprovider_api_request_duration_seconds_bucket",
    ):
        assert family in exprs, family
    assert 'job="dbp-metrics"' in exprs

    code, out, err = render_cli(tmp_path, VALUES, "--only", "dashboard", "--format", "configmap", capsys=capsys)
    assert code == 0, err
    (config_map,) = yaml.safe_load_all(out)
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["dbprovider.json"]) == dashboard
    assert config_map["metadata"]["namespace"] == "databases"

    elsewhere = values(dashboard={"namespace": "monitoring", "labels": {"team": "db", "grafana_dashboard": "0"}})
    code, out, err = render_cli(tmp_path, elsewhere, "--only", "dashboard", "--format", "configmap", capsys=capsys)
    assert code == 0, err
    (config_map,) = yaml.safe_load_all(out)
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["team"] == "db"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


# --- RBAC ----------------------------------------------------------------------------------------------


def test_shard_secret_roles_are_get_by_name_only() -> None:
    roles = [r for r in by_kind(OBJECTS, "Role") if r["metadata"]["name"] == "dbp-shard-secrets"]
    assert [r["metadata"]["namespace"] for r in roles] == ["pg-a"]  # the release namespace needs none
    assert roles[0]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["pg-a-provisioner", "pg-a2-provisioner"],
            "verbs": ["get"],
        }
    ]


def test_keldon_access_only_with_the_cloudberry_engine() -> None:
    def groups(data: dict[str, Any]) -> set[str]:
        role = one(render_manifests(load_install_config(data)), "ClusterRole")
        return {g for rule in role["rules"] for g in rule["apiGroups"]}

    assert "keldon.io" not in groups(VALUES)
    with_cloudberry = groups(values(engines={"cloudberry": {"enabled": True}}))
    assert "keldon.io" in with_cloudberry
    role = one(render_manifests(load_install_config(values(engines={"cloudberry": {"enabled": True}}))), "ClusterRole")
    (keldon,) = [r for r in role["rules"] if r["apiGroups"] == ["keldon.io"]]
    assert keldon == {"apiGroups": ["keldon.io"], "resources": ["databaseclusters"], "verbs": ["get", "list", "watch"]}


def test_break_glass_groups_are_quoted_into_the_policy() -> None:
    groups = ["system:masters", 'odd"group', "back\\slash"]
    objects = render_manifests(load_install_config(values(deletionProtection={"breakGlassGroups": groups})))
    policy = one(objects, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        '!request.userInfo.groups.exists(g, g in ["system:masters", "odd\\"group", "back\\\\slash"])'
    )
    none = render_manifests(load_install_config(values(deletionProtection={"breakGlassGroups": []})))
    assert one(none, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"] == "true"


# --- the rule ------------------------------------------------------------------------------------------


def _exprs(data: dict[str, Any]) -> list[str]:
    rule = render_prometheus_rule(load_install_config(data))
    return [r["expr"] for r in rule["spec"]["groups"][0]["rules"]]


def test_every_expression_selects_the_job_and_the_cluster() -> None:
    exprs = _exprs(VALUES)
    assert len(exprs) == 11  # the ten alerts and the guard DBProviderClusterLabelMissing
    for expr in exprs:
        selectors = [part.split("}")[0] for part in expr.split("{")[1:]]
        # cluster="" (series without the label) only where the guard looks for misconfigured scrapes.
        assert selectors and all(
            'job="dbp-metrics"' in s and ('cluster="eu-1"' in s or 'cluster=""' in s) for s in selectors
        ), expr


def test_without_cluster_no_expression_selects_one() -> None:
    for expr in _exprs(values(prometheusRule={"enabled": True, "jobSelector": "custom-job"})):
        assert 'cluster="' not in expr
        assert 'job="custom-job"' in expr


def test_rule_names_stay_valid_for_any_cluster_value() -> None:
    rule = render_prometheus_rule(load_install_config(values(prometheusRule={"enabled": True, "cluster": "EU West/1"})))
    name = rule["metadata"]["name"]
    assert name.startswith("dbp-eu-west-1-") and len(name) <= 63
    assert rule["metadata"]["labels"]["db.bnerd.com/cluster"]


# --- docs ------------------------------------------------------------------------------------------------


def _dotted_keys(schema: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for name, node in schema.get("properties", {}).items():
        ref = node.get("$ref") or next((b.get("$ref") for b in node.get("anyOf", []) if "$ref" in b), None)
        target = defs[ref.rsplit("/", 1)[-1]] if ref else node
        if target.get("properties"):
            keys |= _dotted_keys(target, defs, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_install_guide_documents_every_config_key() -> None:
    from domain.config import InstallConfig

    schema = InstallConfig.model_json_schema(by_alias=True)
    guide = (REPO_ROOT / "docs" / "install.md").read_text()
    missing = sorted(k for k in _dotted_keys(schema, schema["$defs"]) if f"`{k}`" not in guide)
    assert not missing
    for alert in (
        "DBProviderDown",
        "DBProviderShardNotReady",
        "DBProviderShardScalingTooLong",
        "DBProviderDatabaseStuckProvisioning",
        "DBProviderShardNearCapacity",
        "DBProviderReconcileErrors",
        "DBProviderDatabaseFailed",
        "DBProviderDeletionHeld",
        "DBProviderMoveStuck",
        "DBProviderDrainMovesFailed",
    ):
        assert f"`{alert}`" in guide
