"""domain.settings is the one source of the values the manifests, the image and the manager must agree on.

Each test compares two sides that used to be written separately (the rendered Deployment and the
manager's defaults, the Dockerfile and the Deployment, the elector and the options), so a value
hard-coded differently on one side fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from falcon import testing
from kubernetes.client import ApiClient

from api.app import create_app
from api.server import ApiServer, FrontDoorOptions
from dbprovider.cli import build_parser
from dbprovider.manager import ManagerOptions
from domain.config import ApiConfig, load_install_config
from domain.constants import SHARD_CA_FILE
from domain.settings import SETTINGS, Backoff
from informers import Informer, Rest
from informers.resource import CONFIGMAPS
from infra.render import render_manifests
from reconciler.runtime import ControllerManager, ExponentialBackoff, LeaderElector
from reconciler.sql.session import RECONNECT_BACKOFF

REPO = Path(__file__).resolve().parents[3]
CONFIG = load_install_config(
    {"tls": {"secretName": "api-tls"}, "shardTLS": {"caBundle": {"configMap": {"name": "ca", "key": "ca.crt"}}}}
)


def _deployment() -> dict[str, Any]:
    (deployment,) = (o for o in render_manifests(CONFIG) if o["kind"] == "Deployment")
    return deployment


def _container() -> dict[str, Any]:
    (container,) = _deployment()["spec"]["template"]["spec"]["containers"]
    return container


def _env() -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _container()["env"]}


def _mounted_files() -> set[str]:
    """Absolute paths of every file the Deployment's projected config volume provides."""
    (mount,) = (m for m in _container()["volumeMounts"] if m["name"] == "config")
    (volume,) = (v for v in _deployment()["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    sources = volume["projected"]["sources"]
    return {f"{mount['mountPath']}/{item['path']}" for s in sources for src in s.values() for item in src["items"]}


def test_the_manager_listens_where_the_deployment_and_the_services_point() -> None:
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    args = build_parser().parse_args(["manager"])
    options = ManagerOptions(config=CONFIG, namespace="ns")
    assert ports == {"https": args.api_port, "metrics": args.metrics_port}
    assert ports == {"https": options.api_port, "metrics": options.metrics_port}
    assert ApiServer(lambda *_: None, cert_file="c", key_file="k").requested_port == ports["https"]
    (metrics,) = (o for o in render_manifests(CONFIG) if o["metadata"]["name"] == CONFIG.metrics_service_name())
    assert metrics["spec"]["ports"][0]["port"] == ports["metrics"]
    assert ports == {"https": SETTINGS.ports.api, "metrics": SETTINGS.ports.metrics}


def test_the_manager_reads_the_files_and_environment_the_deployment_provides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SETTINGS.env.config, raising=False)
    env, files = _env(), _mounted_files()
    options = ManagerOptions(config=CONFIG, namespace="ns")
    config_default = build_parser().parse_args(["manager"]).config
    # The manager's own defaults are the files the volume holds ...
    assert {config_default, options.tls_cert, options.tls_key, SHARD_CA_FILE} == files
    # ... and the environment it reads names the same files.
    assert env[SETTINGS.env.config] == config_default == _container()["args"][-1]
    assert (env[SETTINGS.env.tls_cert], env[SETTINGS.env.tls_key]) == (options.tls_cert, options.tls_key)
    assert {SETTINGS.env.pod_name, SETTINGS.env.pod_namespace} <= set(env)
    monkeypatch.setenv(SETTINGS.env.config, "/elsewhere.yaml")
    assert build_parser().parse_args(["manager"]).config == "/elsewhere.yaml"


def test_the_probes_hit_paths_the_api_serves() -> None:
    ready = SimpleNamespace(ready=lambda: True)
    client = testing.TestClient(create_app(CONFIG, ready, ready))  # type: ignore[arg-type]
    container = _container()
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == "https" and get["scheme"] == "HTTPS"
        assert client.simulate_get(get["path"]).status_code == 200
    assert client.simulate_get("/nothing-here").status_code == 404  # the check above can fail


def test_the_image_matches_the_deployment() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    pod = _deployment()["spec"]["template"]["spec"]["securityContext"]
    (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert {int(user[0]), int(user[1])} == {pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]}
    (expose,) = re.findall(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE)
    assert sorted(int(p) for p in expose.split()) == sorted(p["containerPort"] for p in _container()["ports"])
    (cmd,) = re.findall(r"^CMD (.+)$", dockerfile, re.MULTILINE)
    assert json.loads(cmd) == _container()["args"] == ["manager", "--config", SETTINGS.files.config]


def test_every_elector_campaigns_with_the_same_lease_timings() -> None:
    rest = Rest(ApiClient())
    options = ManagerOptions(config=CONFIG, namespace="ns")
    manager = ControllerManager(rest, lease_namespace="ns")
    assert manager.elector is not None
    for elector in (LeaderElector(rest, "ns", "lock"), manager.elector):
        assert elector.timings == SETTINGS.lease
        assert (elector.timings.duration, elector.timings.renew_deadline, elector.timings.retry_period) == (
            options.lease_duration,
            options.renew_deadline,
            options.retry_period,
        )
    with pytest.raises(ValueError, match="lease_duration > renew_deadline"):
        LeaderElector(rest, "ns", "lock", renew_deadline=SETTINGS.lease.duration)


def test_the_front_door_defaults_are_the_install_configs() -> None:
    server = ApiServer(lambda *_: None, cert_file="c", key_file="k")
    assert FrontDoorOptions.from_config(ApiConfig()) == server.options
    assert (server.limits.max_total, server.limits.max_per_client) == (
        server.options.max_connections,
        server.options.max_connections_per_client,
    )
    assert server.consumer_requests.per_consumer == server.options.max_requests_per_consumer


def test_one_backoff_type_gives_each_scheme_its_sequence() -> None:
    queue = ExponentialBackoff()
    assert [queue.when("k") for _ in range(11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert queue.scheme == SETTINGS.retry.reconcile
    assert [RECONNECT_BACKOFF.delay(n) for n in range(5)] == [0.2, 1.0, 2.0, 2.0, 2.0]
    assert [SETTINGS.watch.relist.delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert Informer(Rest(ApiClient()), CONFIGMAPS)._backoff == SETTINGS.watch.relist
    assert Backoff(1.0).delay(5000) == float("inf") and Backoff(1.0, cap=9).delay(5000) == 9  # no OverflowError
    assert SETTINGS.retry.reconcile.capped(0.5) == Backoff(1.0, 2.0, 1.0)  # never below the base
    with pytest.raises(ValueError):
        Backoff(0.0)
    with pytest.raises(Exception, match="cannot assign"):
        SETTINGS.ports.api = 1  # type: ignore[misc]


def test_the_pod_drains_before_sigterm_and_stops_within_its_grace_period() -> None:
    """The preStop sleep keeps the pod serving while the Services drop it (tests/cluster measures that
    a rollout fails no request); after SIGTERM the manager's own bounded steps fit the grace period."""
    pod = _deployment()["spec"]["template"]["spec"]
    assert _container()["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", str(SETTINGS.termination.drain)]}}
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.termination.grace
    server = ApiServer(lambda *_: None, cert_file="c", key_file="k")
    # Manager.stop(): the API (its in-flight requests), the controllers (30 s bound, in practice quick),
    # then the Lease release; the drain runs before SIGTERM, inside the same grace period.
    steps = SETTINGS.termination.drain + server.options.shutdown_timeout + SETTINGS.lease.release_timeout
    assert steps < SETTINGS.termination.grace


def test_a_large_fleet_checks_its_ready_shards_less_often_up_to_the_guides_minute() -> None:
    """Each Ready check is a fresh TLS + SCRAM login: 200 shards at 15 s kept an idle manager at 7% of a core."""
    checks = SETTINGS.shard_checks
    assert checks.ready_interval_for(20) == checks.ready_interval == 15.0
    assert checks.ready_interval_for(45) == 15.0
    assert checks.ready_interval_for(120) == 40.0
    assert checks.ready_interval_for(200) == checks.ready_interval_for(100_000) == 60.0  # the longest interval
    assert 180 / checks.ready_interval_for(180) == checks.ready_checks_per_second  # beyond 180, the minute rules
    assert checks.ready_interval_for(3, interval=1.0) == 1.0  # a test's short interval holds in a small fleet
