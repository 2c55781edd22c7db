"""The agent's alert rules in a REAL Prometheus, scraping a real agent in a consumer cluster of its own (a
second real kube-apiserver) that talks to a real provider (the manager on the session apiserver and
PostgreSQL).

Real causes drive every alert: a claim of a size class the provider does not know (not Ready), a
ResourceQuota that refuses a claim's Secret (Secret writes failing), the provider stopped (unreachable),
the Role of the agent's Lease unbound (no leader), the agent stopped (down); clearing each cause clears
its alert. Time is compressed by the test-only render option (`--test-time-scale 60`); the agent polls
every second and backs off for at most two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from agent.metrics import AgentEndpoint, AgentMetrics
from agent.provider import Provider
from agent.runner import Agent, AgentOptions
from dbprovider.devstack import DevStack
from domain.agent_config import load_agent_config
from domain.resources import CLAIMS
from harness import KubeControlPlane
from harness.process import free_port
from harness.prometheus import PrometheusServer
from informers import SECRETS, Resource, Rest
from infra.render import render_agent_manifests, render_agent_prometheus_rule, rule_groups
from tests.support.alerting import Replica, firing, scrape_job
from tests.support.common import unique, wait_for
from tests.support.devstack import install_stack, remove_stack
from tests.support.kubeapi import KubeApi, apply_all

TIME_SCALE = 60
AGENT_NAMESPACE = "dbprovider-agent"
AGENT_NAME = "dbprovider-agent"
JOB = "dbprovider-agent-metrics"  # the rules' default job: the agent's metrics Service
SCRAPE = "1s"
ALERT_TIMEOUT = 120.0
VALUES = {"providerUrl": "https://127.0.0.1", "tokenSecret": "dbprovider-token", "namespace": AGENT_NAMESPACE}
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    created = install_stack(kube, postgres_pool.get("18"), tmp_path_factory.mktemp("agent-alerts"), unique("agal"))
    yield created
    remove_stack(kube, created)


class RunningAgent:
    """`dbprovider agent` in this process, as its rendered ServiceAccount, its metrics on a fixed port (the
    scrape target), stopped and started as a pod would be (new metrics each start)."""

    def __init__(self, consumer: KubeControlPlane, stack: DevStack, provider_url: str, token_file: Path) -> None:
        token = consumer.service_account_token(AGENT_NAMESPACE, AGENT_NAME)
        self.rest = Rest(ApiClient(consumer.configuration(token=token)))
        self.stack, self.provider_url, self.token_file = stack, provider_url, token_file
        self.port = free_port()
        self.agent: Agent | None = None
        self.endpoint: AgentEndpoint | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        metrics = AgentMetrics()
        provider = Provider(self.provider_url, self.token_file, self.stack.ca_file, on_answer=metrics.observe_request)
        options = AgentOptions(namespace=AGENT_NAMESPACE, poll_interval=1.0, retry_interval=1.0, max_backoff=2.0)
        self.agent = Agent(self.rest, provider, options, metrics)
        self.endpoint = AgentEndpoint(self.port, metrics.registry, self.agent.alive, self.agent.ready, "127.0.0.1")
        self.endpoint.start()
        self.agent.start()

    def stop(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None
        if self.agent is not None:
            self.agent.stop()
            self.agent = None


def _claim(admin: Rest, consumer: KubeControlPlane, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    consumer.ensure_namespace(namespace)
    body = {
        "apiVersion": CLAIMS.api_version,
        "kind": "DatabaseClaim",
        "metadata": {"name": "db", "namespace": namespace},
        "spec": spec,
    }
    return admin.create(CLAIMS, body, namespace)


def _ready(admin: Rest, namespace: str) -> str | None:
    """The claim `db` of `namespace`'s Ready status and reason, e.g. "False/UnknownSizeClass"."""
    claim = admin.get(CLAIMS, "db", namespace)
    ready = next((c for c in (claim.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)
    return f"{ready['status']}/{ready['reason']}" if ready else None


def _wait(server: PrometheusServer, check: Callable[[dict[str, list[dict[str, Any]]]], bool], what: str) -> None:
    try:
        wait_for(lambda: check(firing(server)), timeout=ALERT_TIMEOUT, what=what)
    except AssertionError as exc:
        states = sorted((a["labels"]["alertname"], a["state"]) for a in server.alerts())
        raise AssertionError(f"{exc}; alerts: {states}") from None


def _only(server: PrometheusServer, name: str) -> dict[str, Any]:
    (alert,) = firing(server)[name]
    assert alert["labels"]["job"] == JOB and alert["labels"]["namespace"] == AGENT_NAMESPACE
    assert alert["annotations"]["runbook_url"].endswith(f"docs/consumers.md#{name.lower()}")
    return alert


def test_every_agent_alert_fires_on_a_real_cause_and_clears(
    stack: DevStack, kube: KubeControlPlane, tmp_path: Path
) -> None:
    provider = Replica(stack, unique("agal-provider"), TIME_SCALE)
    provider.start()
    try:
        with KubeControlPlane() as consumer, consumer.admin_client() as client:
            admin = Rest(client)
            consumer.ensure_namespace(AGENT_NAMESPACE)
            manifests = render_agent_manifests(load_agent_config(VALUES))
            apply_all(KubeApi(client), manifests)
            token_file = tmp_path / "token"
            token_file.write_text(stack.token + "\n")
            agent = RunningAgent(consumer, stack, provider.endpoints.url(""), token_file)
            agent.start()
            rules = rule_groups(render_agent_prometheus_rule(load_agent_config(VALUES), TIME_SCALE))
            server = PrometheusServer(
                tmp_path / "prometheus",
                {
                    "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
                    "scrape_configs": [scrape_job(JOB, agent.target, SCRAPE)],
                },
                {"agent.rules.yaml": yaml.safe_dump(rules, sort_keys=False)},
            )
            server.start()
            try:
                _drive(consumer, admin, manifests, agent, provider, server)
            finally:
                server.close()
                agent.stop()
    finally:
        provider.stop()


def _drive(
    consumer: KubeControlPlane,
    admin: Rest,
    manifests: list[dict[str, Any]],
    agent: RunningAgent,
    provider: Replica,
    server: PrometheusServer,
) -> None:
    # A healthy agent with a Ready claim: nothing fires, every rule evaluates.
    healthy = unique("ok")
    _claim(admin, consumer, healthy, {})
    wait_for(lambda: _ready(admin, healthy) == "True/Ready", 120, "a Ready claim")
    wait_for(lambda: server.api("query", query=f'dbprovider_agent_leader{{job="{JOB}"}} == 1')["result"], 60, "scraped")
    _wait(server, lambda f: not f, "nothing firing on a healthy agent")
    rules = server.rules()
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]

    # A claim the provider refuses (not Ready), and one whose Secret a ResourceQuota refuses.
    refused, quota = unique("refused"), unique("quota")
    _claim(admin, consumer, refused, {"sizeClass": "no-such-class"})
    consumer.ensure_namespace(quota)
    resource_quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-secrets", "namespace": quota},
        "spec": {"hard": {"count/secrets": "0"}},
    }
    created = admin.create(RESOURCE_QUOTAS, resource_quota, quota)
    # What the controller manager (which this apiserver runs without) writes: none used of none allowed.
    created["status"] = {"hard": {"count/secrets": "0"}, "used": {"count/secrets": "0"}}
    admin.replace(RESOURCE_QUOTAS, created, subresource="status")
    _claim(admin, consumer, quota, {})
    try:
        wait_for(lambda: _ready(admin, quota) == "False/SecretWriteFailed", 120, "SecretWriteFailed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {admin.get(CLAIMS, 'db', quota).get('status')}") from None
    _wait(
        server,
        lambda f: {"DBProviderAgentClaimsNotReady", "DBProviderAgentSecretWritesFailing"} <= set(f),
        "not Ready and Secret writes failing",
    )
    described = _only(server, "DBProviderAgentClaimsNotReady")["annotations"]["description"]
    assert "SecretWriteFailed (1)" in described and "UnknownSizeClass (1)" in described, described
    assert _only(server, "DBProviderAgentSecretWritesFailing")["labels"]["action"] == "create"
    assert set(firing(server)) == {"DBProviderAgentClaimsNotReady", "DBProviderAgentSecretWritesFailing"}

    # Cleared: the refused claim deleted, the quota lifted (its claim then gets its Secret).
    admin.delete(CLAIMS, "db", refused)
    admin.delete(RESOURCE_QUOTAS, "no-secrets", quota)
    wait_for(lambda: _ready(admin, quota) == "True/Ready", 60, "the quota's claim Ready")
    assert admin.get(SECRETS, "db", quota)
    _wait(server, lambda f: not f, "every alert cleared")

    # The provider stopped: unreachable once the last sync is older than the (scaled) threshold.
    provider.stop()
    _wait(server, lambda f: "DBProviderAgentProviderUnreachable" in f, "DBProviderAgentProviderUnreachable")
    described = _only(server, "DBProviderAgentProviderUnreachable")["annotations"]["description"]
    assert "ProviderUnavailable" in described, described
    provider.start()
    _wait(server, lambda f: not f, "unreachable cleared")

    # The Lease's Role unbound: the agent cannot renew and stops leading; bound again, it leads again.
    (binding,) = [o for o in manifests if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-lease")]
    admin.delete(ROLE_BINDINGS, binding["metadata"]["name"], AGENT_NAMESPACE)
    _wait(server, lambda f: "DBProviderAgentNoLeader" in f, "DBProviderAgentNoLeader")
    assert "DBProviderAgentProviderUnreachable" not in firing(server)
    admin.create(ROLE_BINDINGS, binding, AGENT_NAMESPACE)
    _wait(server, lambda f: not f, "no leader cleared")

    # The agent stopped: down; started again: cleared.
    agent.stop()
    _wait(server, lambda f: "DBProviderAgentDown" in f, "DBProviderAgentDown")
    agent.start()
    _wait(server, lambda f: not f, "down cleared")
