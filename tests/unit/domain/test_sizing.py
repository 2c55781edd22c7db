"""The manager's resources as install keys (domain.sizing): validated, rendered into the Deployment (which the
Pulumi program creates from the same templates), and what api.maxConnections is checked against."""

from __future__ import annotations

from typing import Any

import pytest

from domain.config import ConfigError, load_install_config
from domain.sizing import SIZING, cpu_millis, memory_bytes, memory_needed_mib
from infra.render import render_manifests
from tests.unit.domain.test_api_config import MINIMAL


def manager_resources(values: dict[str, Any]) -> dict[str, Any]:
    manifests = render_manifests(load_install_config({**MINIMAL, **values}))
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "manager"
    resources: dict[str, Any] = container["resources"]
    return resources


def test_defaults_and_overrides_are_rendered_into_the_deployment() -> None:
    assert manager_resources({}) == {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}}
    raised = {"resources": {"manager": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi", "cpu": "2"}}}}
    assert manager_resources(raised) == {
        "requests": {"cpu": "100m", "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }
    unlimited = {"resources": {"manager": {"limits": {"memory": None}}}}
    assert manager_resources(unlimited) == {"requests": {"cpu": "100m", "memory": "192Mi"}}


@pytest.mark.parametrize(
    ("manager", "path", "words"),
    [
        ({"limits": {"memory": "512MB"}}, "resources.manager.limits.memory", "memory quantity"),
        ({"requests": {"cpu": "fast"}}, "resources.manager.requests.cpu", "CPU quantity"),
        ({"requests": {"memory": "0"}}, "resources.manager.requests.memory", "more than 0"),
        ({"requests": {"memory": "1Gi"}}, "resources.manager", "must not exceed limits.memory"),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}, "resources.manager", "must not exceed limits.cpu"),
        ({"limit": {}}, "resources.manager.limit", ""),
    ],
)
def test_invalid_resources_are_named(manager: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_install_config({**MINIMAL, "resources": {"manager": manager}})
    problems = dict(refused.value.problems)
    assert path in problems and words in problems[path], problems


def test_max_connections_follow_the_configured_memory_limit() -> None:
    with pytest.raises(ConfigError) as refused:
        load_install_config({**MINIMAL, "api": {"maxConnections": 5000}})
    assert "at most 2730" in dict(refused.value.problems)["api.maxConnections"]
    raised = {"resources": {"manager": {"limits": {"memory": "1Gi"}}}, "api": {"maxConnections": 5000}}
    assert load_install_config({**MINIMAL, **raised}).api.max_connections == 5000


def test_quantities_and_the_sizing_arithmetic() -> None:
    assert [memory_bytes(q) for q in ("512Mi", "1Gi", "600M", "1024", "2k")] == [2**29, 2**30, 6 * 10**8, 1024, 2000]
    assert [cpu_millis(q) for q in ("100m", "0.5", "2", "1.25")] == [100, 500, 2000, 1250]
    assert SIZING.manager_memory_mib(0, 0) == SIZING.base_mib
    assert memory_needed_mib(0, 0, 2**20) == SIZING.base_mib + 1
    # docs/install.md's example: 100,000 Databases, 1,000 Consumers, the default 1,000 API connections
    assert memory_needed_mib(100_000, 1_000, 1_000 * 96 * 1024) == 551
