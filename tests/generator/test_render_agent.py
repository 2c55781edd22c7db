"""`dbprovider render --agent`: the consumer agent's objects from its values, and the examples of
docs/consumers.md (the values file and the claim) valid as written."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from dbprovider.render import EXIT_INVALID, EXIT_OK, run_render_agent
from domain.agent_config import load_agent_config
from domain.specs import DatabaseClaimSpec
from infra.render import render_agent_manifests
from tests.support.documented import file_block

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumers.md"


def test_the_documented_values_and_claim_are_valid() -> None:
    values, claim = (yaml.safe_load(file_block(DOC, name)) for name in ("agent.yaml", "claim.yaml"))
    assert isinstance(values, dict) and isinstance(claim, dict)
    config = load_agent_config(values)
    assert config.ca_secret == "dbprovider-ca"
    assert claim["kind"] == "DatabaseClaim"
    assert DatabaseClaimSpec.model_validate(claim["spec"]).size_class == "small"


def test_render_agent_writes_the_objects(tmp_path: Path) -> None:
    values = tmp_path / "agent.yaml"
    values.write_text(yaml.safe_dump({"providerUrl": "https://p.example:8443", "tokenSecret": "tok"}))
    out = tmp_path / "agent-objects.yaml"
    assert run_render_agent(str(values), str(out), stderr=io.StringIO()) == EXIT_OK
    objects = list(yaml.safe_load_all(out.read_text()))
    assert objects == render_agent_manifests(load_agent_config(yaml.safe_load(values.read_text())))
    assert [o["kind"] for o in objects][:1] == ["CustomResourceDefinition"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["agent", "--provider-url", "https://p.example:8443"]
    assert "--ca-file" not in args  # no caSecret: the system CAs


def test_invalid_values_name_the_key(tmp_path: Path) -> None:
    values = tmp_path / "agent.yaml"
    values.write_text(yaml.safe_dump({"providerUrl": "http://plain.example", "tokenSecret": "tok"}))
    err = io.StringIO()
    assert run_render_agent(str(values), str(tmp_path / "out.yaml"), stderr=err) == EXIT_INVALID
    assert "providerUrl" in err.getvalue() and "https://" in err.getvalue()


def rendered(**values: object) -> dict[str, list[dict[str, Any]]]:
    """The objects of `render --agent` for these values (with the required ones), by kind."""
    objects = render_agent_manifests(
        load_agent_config({"providerUrl": "https://p.example", "tokenSecret": "t", **values})
    )
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    return by_kind


def test_the_agent_is_probed_and_scraped_on_its_port() -> None:
    objects = rendered()
    (deployment,) = objects["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["args"][container["args"].index("--metrics-port") + 1] == "8080"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    (service,) = objects["Service"]
    assert service["metadata"]["name"] == "dbprovider-agent-metrics"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert "ServiceMonitor" not in objects  # off by default: its CRD may not be installed


def test_a_service_monitor_selects_the_metrics_service() -> None:
    monitor_values = {"enabled": True, "labels": {"release": "kps"}, "interval": "15s", "scrapeTimeout": "10s"}
    objects = rendered(metrics={"serviceMonitor": monitor_values})
    (monitor,) = objects["ServiceMonitor"]
    (service,) = objects["Service"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "app.kubernetes.io/version" not in monitor["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_the_agent_may_patch_deployments_and_nothing_more_of_them() -> None:
    (role,) = rendered()["ClusterRole"]
    rules = [rule for rule in role["rules"] if "deployments" in rule["resources"]]
    assert rules == [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]


def container_resources(**values: object) -> dict[str, Any]:
    (deployment,) = rendered(**values)["Deployment"]
    return dict(deployment["spec"]["template"]["spec"]["containers"][0]["resources"])


def test_resources_have_defaults_and_can_be_set_or_removed() -> None:
    assert container_resources() == {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}}
    chosen = {"requests": {"memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert container_resources(resources=chosen) == {
        "requests": {"cpu": "20m", "memory": "200Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert container_resources(resources={"limits": {"memory": None}}) == {"requests": {"cpu": "20m", "memory": "96Mi"}}


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"requests": {"memory": "512Mi"}}, "requests.memory (512Mi) must not exceed limits.memory (256Mi)"),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}, "requests.cpu (2) must not exceed limits.cpu (500m)"),
        ({"limits": {"memory": "lots"}}, "resources.limits.memory: must be a memory quantity"),
        ({"requests": {"cpu": "0"}}, "resources.requests.cpu: must be more than 0"),
        ({"request": {"cpu": "1"}}, "resources.request"),
    ],
)
def test_invalid_resources_name_the_key(tmp_path: Path, resources: dict[str, Any], message: str) -> None:
    values = tmp_path / "agent.yaml"
    values.write_text(yaml.safe_dump({"providerUrl": "https://p.example", "tokenSecret": "t", "resources": resources}))
    err = io.StringIO()
    assert run_render_agent(str(values), str(tmp_path / "out.yaml"), stderr=err) == EXIT_INVALID
    assert message in err.getvalue(), err.getvalue()
