"""The agent's Pulumi component under `pulumi.runtime.set_mocks`: the objects of `render --agent`, the CRD
first and retained, the namespaces read and never created."""

from __future__ import annotations

from domain.agent_config import load_agent_config
from infra.agent_component import TYPE_TOKEN, DbProviderAgent
from infra.render import render_agent_manifests
from tests.generator.pulumi_mocks import ProgramRun, run_body

VALUES = {
    "providerUrl": "https://dbprovider.example:8443",
    "tokenSecret": "dbprovider-token",
    "caSecret": "dbprovider-ca",
    "namespace": "agents",
    "watchNamespace": "team-a",
}


def agent_run() -> ProgramRun:
    return run_body(lambda: DbProviderAgent("agent", load_agent_config(VALUES)))


def test_the_component_creates_what_render_agent_renders() -> None:
    run = agent_run()
    (root,) = run.of_type(TYPE_TOKEN)
    objects = run.kubernetes_objects()
    rendered = render_agent_manifests(load_agent_config(VALUES))
    assert sorted(r.typ.rsplit(":", 1)[1] for r in objects) == sorted(o["kind"] for o in rendered)
    assert all(r.parent == root.urn for r in objects)
    assert {r.name for r in objects if r.typ.endswith(":Role")} == {
        "team-a/dbprovider-agent",
        "agents/dbprovider-agent-lease",
    }


def test_the_crd_comes_first_and_is_kept_on_destroy() -> None:
    run = agent_run()
    (crd,) = run.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert crd.name == "databaseclaims.db.bnerd.com" and crd.retain_on_delete
    assert run.of_type("kubernetes:core/v1:Namespace") == []
    for reg in run.kubernetes_objects():
        if reg is not crd:
            assert crd.urn in reg.dependencies, reg.name


def test_the_component_carries_resources_and_the_service_monitor() -> None:
    values = {
        **VALUES,
        "resources": {"limits": {"memory": "384Mi"}},
        "metrics": {"serviceMonitor": {"enabled": True}},
    }
    run = run_body(lambda: DbProviderAgent("agent", load_agent_config(values)))
    (deployment,) = run.of_type("kubernetes:apps/v1:Deployment")
    (container,) = deployment.inputs["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "384Mi"}}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (monitor,) = run.of_type("kubernetes:monitoring.coreos.com/v1:ServiceMonitor")
    assert monitor.inputs["spec"]["endpoints"][0]["port"] == "metrics"
    assert [r.name for r in run.of_type("kubernetes:core/v1:Service")] == ["agents/dbprovider-agent-metrics"]
