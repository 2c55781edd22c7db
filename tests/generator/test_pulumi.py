"""The Pulumi program under `pulumi.runtime.set_mocks`: resource graph, providers, and equality with render."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from dbprovider.render import EXIT_OK, FORMAT_CONFIGMAP, ONLY_DASHBOARD, run_render
from domain.config import load_install_config
from infra.component import TYPE_TOKEN
from infra.config import PULUMI_ONLY_KEYS
from infra.render import WARNING_NO_CLUSTER, dump_yaml, object_key, render_manifests, render_prometheus_rule
from tests.generator.pulumi_mocks import REPO_ROOT, ProgramRun, Registration, run_program

BASE: dict[str, Any] = {
    "namespace": "databases",
    "tls": {"secretName": "dbprovider-tls"},
    "shardSecrets": [
        {"namespace": "pg-a", "name": "pg-a-provisioner"},
        {"namespace": "pg-b", "name": "pg-b-provisioner"},
    ],
    "metrics": {"serviceMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True, "cluster": "eu-1"},
}
PROMETHEUS_KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\n"
# How the engine marks a secret value on the wire (pulumi.runtime.rpc).
SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET_VALUE_SIG = "1b47061264138c4ac30d75fd1eb44270"


def config(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def install_values(values: dict[str, Any]) -> dict[str, Any]:
    """The stack config without the Pulumi-only keys: what `dbprovider render --config` reads."""
    return {k: v for k, v in values.items() if k not in PULUMI_ONLY_KEYS}


def rendered_dashboard(values: dict[str, Any], tmp_path: Path, fmt: str | None = None) -> str:
    """What `dbprovider render --only dashboard [--format ...]` writes for the same install config."""
    config_file = tmp_path / "values.yaml"
    config_file.write_text(yaml.safe_dump(install_values(values)))
    out = tmp_path / "dashboard.out"
    status = run_render(str(config_file), only=ONLY_DASHBOARD, output=str(out), stderr=io.StringIO(), fmt=fmt)
    assert status == EXIT_OK
    return out.read_text()


def normalized(value: Any) -> Any:
    """Inputs as the engine sees them: numbers travel as floats, so compare 2.0 and 2 as equal."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def registered_objects(run: ProgramRun) -> dict[tuple[str, str, str, str], Registration]:
    objects = {}
    for reg in run.kubernetes_objects():
        key = object_key(reg.inputs)
        assert key not in objects, f"registered twice: {key}"
        objects[key] = reg
    return objects


def component(run: ProgramRun) -> Registration:
    (found,) = run.of_type(TYPE_TOKEN)
    return found


@pytest.fixture(scope="module")
def full_run() -> ProgramRun:
    return run_program(config(prometheusKubeconfig=PROMETHEUS_KUBECONFIG))


# --- the graph -------------------------------------------------------------------------------------------


def test_pulumi_yaml_points_at_the_program() -> None:
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    assert (REPO_ROOT / project["main"] / "__main__.py").is_file()


def test_one_component_parents_every_resource(full_run: ProgramRun) -> None:
    root = component(full_run)
    assert root.name == "dbprovider"
    assert root.parent.endswith("::pulumi:pulumi:Stack::project-stack")
    children = [r for r in full_run.registrations if r is not root]
    assert children
    assert all(r.parent == root.urn for r in children), [r.name for r in children if r.parent != root.urn]
    assert root.urn in full_run.outputs  # register_outputs was called


def test_resource_types_and_names(full_run: ProgramRun) -> None:
    names = {(r.typ, r.name) for r in full_run.registrations}
    expected = {
        ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", "shards.db.bnerd.com"),
        ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", "consumers.db.bnerd.com"),
        ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", "databases.db.bnerd.com"),
        ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", "databasemoves.db.bnerd.com"),
        ("kubernetes:core/v1:ServiceAccount", "databases/dbprovider"),
        ("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "dbprovider"),
        ("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "dbprovider"),
        ("kubernetes:rbac.authorization.k8s.io/v1:Role", "databases/dbprovider"),
        ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "databases/dbprovider"),
        ("kubernetes:rbac.authorization.k8s.io/v1:Role", "pg-a/dbprovider-shard-secrets"),
        ("kubernetes:rbac.authorization.k8s.io/v1:Role", "pg-b/dbprovider-shard-secrets"),
        ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "pg-a/dbprovider-shard-secrets"),
        ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "pg-b/dbprovider-shard-secrets"),
        ("kubernetes:core/v1:ConfigMap", "databases/dbprovider-config"),
        ("kubernetes:core/v1:Service", "databases/dbprovider"),
        ("kubernetes:core/v1:Service", "databases/dbprovider-metrics"),
        ("kubernetes:apps/v1:Deployment", "databases/dbprovider"),
        ("kubernetes:policy/v1:PodDisruptionBudget", "databases/dbprovider"),
        (
            "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
            "dbprovider-shard-deletion-protection",
        ),
        (
            "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
            "dbprovider-shard-deletion-protection",
        ),
        ("kubernetes:monitoring.coreos.com/v1:ServiceMonitor", "databases/dbprovider"),
        ("kubernetes:monitoring.coreos.com/v1:PrometheusRule", "databases/dbprovider-eu-1"),
        ("pulumi:providers:kubernetes", "dbprovider-prometheus"),
        (TYPE_TOKEN, "dbprovider"),
    }
    assert names == expected


def test_crds_come_before_every_other_object(full_run: ProgramRun) -> None:
    crds = full_run.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    crd_urns = {r.urn for r in crds}
    assert len(crd_urns) == 4
    assert all(r.dependencies == crds[0].dependencies for r in crds)  # the namespace reads only
    assert {urn.rsplit("::", 1)[1] for urn in crds[0].dependencies} == {
        "must-exist/databases",
        "must-exist/pg-a",
        "must-exist/pg-b",
    }
    assert all(r.retain_on_delete for r in crds)  # destroying the stack must not delete every Database
    in_db_cluster = [r for r in full_run.kubernetes_objects() if r not in crds and "PrometheusRule" not in r.typ]
    assert in_db_cluster
    for reg in in_db_cluster:
        assert crd_urns <= set(reg.dependencies), reg.name
    first_other = min(full_run.registrations.index(r) for r in in_db_cluster)
    assert max(full_run.registrations.index(r) for r in crds) < first_other


def test_namespaces_are_read_before_anything_and_never_created(full_run: ProgramRun) -> None:
    """A missing namespace fails the read, so nothing is created; destroy never deletes a namespace."""
    assert full_run.of_type("kubernetes:core/v1:Namespace") == []
    for reg in full_run.kubernetes_objects():
        reads = {urn.rsplit("::", 1)[1] for urn in reg.dependencies if ":core/v1:Namespace::" in urn}
        if "PrometheusRule" in reg.typ:  # in the central Prometheus' cluster, through its provider
            assert reads == {"prometheus:must-exist/databases"}
        else:
            assert reads == {"must-exist/databases", "must-exist/pg-a", "must-exist/pg-b"}, reg.name


def test_prometheus_rule_goes_through_the_second_provider(full_run: ProgramRun) -> None:
    (provider,) = full_run.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["enableServerSideApply"] in (True, "true")
    (rule,) = full_run.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.provider.startswith(provider.urn + "::")
    others = [r for r in full_run.kubernetes_objects() if r is not rule]
    assert all(not r.provider.startswith(provider.urn) for r in others)


def test_the_prometheus_kubeconfig_stays_secret(full_run: ProgramRun) -> None:
    (provider,) = full_run.of_type("pulumi:providers:kubernetes")
    kubeconfig = provider.inputs["kubeconfig"]
    assert isinstance(kubeconfig, dict) and kubeconfig.get(SECRET_SIG) == SECRET_VALUE_SIG
    assert kubeconfig["value"] == PROMETHEUS_KUBECONFIG


def test_prometheus_rule_namespace_at_the_central_prometheus_is_configurable() -> None:
    run = run_program(config(prometheusKubeconfig=PROMETHEUS_KUBECONFIG, prometheusNamespace="monitoring"))
    (rule,) = run.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.inputs["metadata"]["namespace"] == "monitoring"


def test_without_a_prometheus_kubeconfig_the_rule_is_an_output_not_a_resource() -> None:
    run = run_program(config())
    assert not run.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert not run.of_type("pulumi:providers:kubernetes")
    outputs = run.outputs[component(run).urn]
    rule = render_prometheus_rule(load_install_config(config()))
    assert outputs["prometheusRuleYaml"] == dump_yaml([rule])


def test_rule_disabled_creates_no_rule_and_no_provider() -> None:
    run = run_program(config(prometheusRule={"enabled": False}, prometheusKubeconfig=PROMETHEUS_KUBECONFIG))
    assert not run.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert not run.of_type("pulumi:providers:kubernetes")
    assert not run.warnings()


def test_optional_objects_follow_the_config() -> None:
    run = run_program(
        config(
            metrics={"serviceMonitor": {"enabled": False}},
            deletionProtection={"enabled": False},
            replicas=1,
            shardSecrets=[],
        )
    )
    kinds = {r.inputs["kind"] for r in run.kubernetes_objects()}
    assert not kinds & {
        "ServiceMonitor",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "PodDisruptionBudget",
    }
    roles = [r for r in run.kubernetes_objects() if r.inputs["kind"] == "Role"]
    assert [r.name for r in roles] == ["databases/dbprovider"]


# --- same objects as `dbprovider render` ---------------------------------------------------------------


@pytest.mark.parametrize("preview", [True, False], ids=["preview", "up"])
def test_pulumi_registers_exactly_the_rendered_objects(preview: bool) -> None:
    values = config(prometheusKubeconfig=PROMETHEUS_KUBECONFIG)
    run = run_program(values, preview=preview)
    install = load_install_config(install_values(values))
    rendered = {object_key(o): o for o in render_manifests(install) + [render_prometheus_rule(install)]}
    registered = registered_objects(run)
    assert set(registered) == set(rendered)
    for key, obj in rendered.items():
        assert normalized(registered[key].inputs) == obj, key


# --- the dashboard -------------------------------------------------------------------------------------


def test_the_dashboard_json_is_a_stack_output_equal_to_the_render(tmp_path: Path) -> None:
    values = config()
    run = run_program(values)
    expected = rendered_dashboard(values, tmp_path)
    assert run.outputs[component(run).urn]["dashboardJson"] == expected  # the stack output: tests/pulumi
    # without dashboardConfigMap nothing is created for it
    assert not [r for r in run.kubernetes_objects() if r.inputs["metadata"]["name"] == "dbprovider-dashboard"]


@pytest.mark.parametrize("preview", [True, False], ids=["preview", "up"])
def test_with_dashboard_configmap_the_rendered_configmap_is_created_in_the_db_cluster(
    tmp_path: Path, preview: bool
) -> None:
    values = config(
        dashboardConfigMap=True,
        dashboard={"namespace": "monitoring", "labels": {"team": "db"}},
        prometheusKubeconfig=PROMETHEUS_KUBECONFIG,
    )
    run = run_program(values, preview=preview)
    (configmap,) = yaml.safe_load_all(rendered_dashboard(values, tmp_path, FORMAT_CONFIGMAP))
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    install = load_install_config(install_values(values))
    rendered = {object_key(o) for o in render_manifests(install) + [render_prometheus_rule(install)]}
    registered = registered_objects(run)
    assert set(registered) == rendered | {object_key(configmap)}
    reg = registered[object_key(configmap)]
    assert normalized(reg.inputs) == configmap
    assert reg.typ == "kubernetes:core/v1:ConfigMap" and reg.name == "monitoring/dbprovider-dashboard"
    assert reg.provider == ""  # the DB cluster's (default) provider, not the central Prometheus' one
    reads = {urn.rsplit("::", 1)[1] for urn in reg.dependencies if ":core/v1:Namespace::" in urn}
    assert reads == {"must-exist/databases", "must-exist/monitoring", "must-exist/pg-a", "must-exist/pg-b"}
    assert run.outputs[component(run).urn]["dashboardJson"] == configmap["data"]["dbprovider.json"]


# --- warnings and errors -------------------------------------------------------------------------------


def test_warning_when_the_rule_has_no_cluster() -> None:
    run = run_program(config(prometheusRule={"enabled": True}))
    assert WARNING_NO_CLUSTER in run.warnings()
    assert WARNING_NO_CLUSTER not in run_program(config()).warnings()


def test_the_overcommit_ratio_of_a_pooled_shard_reaches_the_managers_config() -> None:
    """connectionBudget.overcommit from the stack config is in the ConfigMap the managers read."""
    run = run_program(config(connectionBudget={"overcommit": {"pg-pooled": 2.5}}))
    (config_map,) = [r for r in run.kubernetes_objects() if r.name == "databases/dbprovider-config"]
    (text,) = config_map.inputs["data"].values()
    assert yaml.safe_load(text)["connectionBudget"] == {"reserved": 5, "overcommit": {"pg-pooled": 2.5}}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (config(prometheusRule={"enabled": True, "cluster": 'eu"1'}), "dbprovider:prometheusRule.cluster:"),
        (config(prometheusRule={"enabled": True, "jobSelector": "a\\b"}), "dbprovider:prometheusRule.jobSelector:"),
        (config(prometheusRule={"enabled": True, "cluster": "eu\n1"}), "dbprovider:prometheusRule.cluster:"),
        (config(shardSecret=[]), "dbprovider:shardSecret: is not a known key"),
        (config(tls={}), "dbprovider:tls.secretName: is required"),
        ({k: v for k, v in BASE.items() if k != "tls"}, "dbprovider:tls: is required"),
        (config(replicas="three"), "dbprovider:replicas:"),
        (config(replicas=0), "dbprovider:replicas:"),
        (config(shardSecrets=[{"namespace": "Bad_NS", "name": "x"}]), "dbprovider:shardSecrets[0].namespace:"),
        (config(prometheusNamespace="Not A Namespace"), "dbprovider:prometheusNamespace:"),
        (config(dashboardConfigMap="yes"), "dbprovider:dashboardConfigMap: must be true or false"),
        (
            config(connectionBudget={"overcommit": {"pg-pooled": 0.5}}),
            "dbprovider:connectionBudget.overcommit.pg-pooled:",
        ),
    ],
)
def test_invalid_stack_config_fails_naming_the_key(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(Exception, match="invalid stack config") as excinfo:
        run_program(values)
    assert expected in str(excinfo.value)


def test_the_stuck_move_threshold_reaches_the_prometheus_rule() -> None:
    """moves.stuckAfter from the stack config is DBProviderMoveStuck's threshold, as `dbprovider render` writes it."""
    values = config(moves={"stuckAfter": "90m"})
    run = run_program(values)
    rule = render_prometheus_rule(load_install_config(install_values(values)))
    assert run.outputs[component(run).urn]["prometheusRuleYaml"] == dump_yaml([rule])
    (stuck,) = [r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "DBProviderMoveStuck"]
    assert stuck["expr"].endswith("> 5400")
