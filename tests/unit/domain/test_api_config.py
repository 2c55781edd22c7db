"""The install config's `api` block: the front door's deadlines and connection bounds."""

from __future__ import annotations

from typing import Any

import pytest

from api.server import FrontDoorOptions
from domain.config import ConfigError, load_install_config
from domain.settings import SETTINGS
from infra.render import render_manifests

MINIMAL = {"tls": {"secretName": "api-tls"}}


def test_defaults_reach_the_server() -> None:
    config = load_install_config(MINIMAL)
    expected = {
        "header_timeout": 10.0,
        "body_timeout": 10.0,
        "idle_timeout": 30.0,
        "max_connections": 1000,
        "max_connections_per_client": 100,
        "request_timeout": 10.0,
        "max_requests_per_consumer": 8,
    }
    assert FrontDoorOptions.from_config(config.api) == FrontDoorOptions(**expected)


def test_values_are_read_and_dumped_as_written() -> None:
    api = {
        "headerTimeout": "5s",
        "bodyTimeout": "1m",
        "idleTimeout": "2m30s",
        "requestTimeout": "20s",
        "maxConnections": 50,
        "maxConnectionsPerClient": 5,
        "maxRequestsPerConsumer": 3,
    }
    config = load_install_config({**MINIMAL, "api": api})
    expected = {
        "header_timeout": 5.0,
        "body_timeout": 60.0,
        "idle_timeout": 150.0,
        "max_connections": 50,
        "max_connections_per_client": 5,
        "request_timeout": 20.0,
        "max_requests_per_consumer": 3,
    }
    assert FrontDoorOptions.from_config(config.api) == FrontDoorOptions(**expected)
    assert config.model_dump(by_alias=True, mode="json")["api"] == api  # what the rendered ConfigMap holds


@pytest.mark.parametrize(
    ("api", "path"),
    [
        ({"headerTimeout": "0"}, "api.headerTimeout"),
        ({"headerTimeout": 10}, "api.headerTimeout"),
        ({"bodyTimeout": "-1s"}, "api.bodyTimeout"),
        ({"idleTimeout": "2h"}, "api.idleTimeout"),
        ({"maxConnections": 0}, "api.maxConnections"),
        ({"maxConnections": 2731}, "api.maxConnections"),
        ({"maxConnectionsPerClient": "10"}, "api.maxConnectionsPerClient"),
        ({"requestTimeout": "0"}, "api.requestTimeout"),
        ({"maxRequestsPerConsumer": 0}, "api.maxRequestsPerConsumer"),
        ({"headertimeout": "5s"}, "api.headertimeout"),
    ],
)
def test_invalid_values_are_named(api: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_install_config({**MINIMAL, "api": api})
    assert path in dict(refused.value.problems)


def test_max_connections_must_fit_the_pods_memory_limit() -> None:
    """Each connection counted at its measured worst (bench.front_door) must fit the Deployment's limit."""
    pod = SETTINGS.pod
    assert pod.max_connections == 2730
    assert load_install_config({**MINIMAL, "api": {"maxConnections": 2730}}).api.max_connections == 2730
    with pytest.raises(ConfigError) as refused:
        load_install_config({**MINIMAL, "api": {"maxConnections": 10000}})
    message = dict(refused.value.problems)["api.maxConnections"]
    assert "memory limit of 512Mi" in message and "at most 2730" in message
    deployment = next(m for m in render_manifests(load_install_config(MINIMAL)) if m["kind"] == "Deployment")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == f"{pod.memory_limit_mib}Mi"  # the value the check is against
