"""The alert rules in a REAL Prometheus, scraping a real manager on the real apiserver and PostgreSQL.

Both topologies of docs/operations.md run side by side against one manager:
- agent + central: an agent-mode Prometheus scrapes the manager (external label `cluster`) and
  remote-writes to a central server that evaluates the rules rendered with `--format rules`;
- server mode: one Prometheus scrapes the manager itself with the documented static `cluster` label and
  evaluates the same rules;
plus a misconfigured server (no `cluster` label on the scrape), where the guard alert must fire.

Real causes drive every alert (an unreachable shard, a full shard, NoCapacity, a held delete, a
database stuck provisioning behind a foreign credentials Secret, whose reconcile keeps failing, the
manager stopped), and clearing each cause clears it. Time is compressed by the documented test-only
render option (`--test-time-scale 60`: `for: 15m` is 15 s) and the manager's backoff cap is cut by the
same factor (5 s instead of 300 s), so the suite takes a few minutes.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dbprovider.devstack import DevStack
from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, API_VERSION
from domain.naming import database_object_name
from domain.resources import DATABASES, SHARDS
from harness import KubeControlPlane
from harness.process import free_port
from harness.prometheus import PrometheusServer
from informers import SECRETS, Rest
from infra.dashboard import dashboard_panels
from tests.support.alerting import Replica, rule_file, scrape_job
from tests.support.alerting import firing as _firing
from tests.support.common import b64, wait_for

TIME_SCALE = 60
CLUSTER = "eu-1"
RELEASE = "alerttest"
NAMESPACE = "alerttest-system"
JOB = f"{RELEASE}-metrics"  # the default jobSelector: the metrics Service's name
CONSUMER = "alerttest-consumer"
MAIN_SHARD = "alerttest-pg"
DOWN_SHARD = "alerttest-down"
SCRAPE = "1s"
ALERT_TIMEOUT = 120.0
CONFIG = {
    "releaseName": RELEASE,
    "namespace": NAMESPACE,
    "tls": {"secretName": f"{RELEASE}-tls"},
    "deletionProtection": {"enabled": False},
    "softDelete": {"retention": "0"},
    "prometheusRule": {"enabled": True, "cluster": CLUSTER},
}


def _rule_file() -> str:
    return rule_file(CONFIG, TIME_SCALE)


def _scrape_job(target: str, cluster: str = "") -> dict[str, Any]:
    return scrape_job(JOB, target, SCRAPE, cluster)


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool, tmp_path_factory) -> Iterator[DevStack]:
    created = DevStack(
        kube,
        postgres_pool.get("18"),
        tmp_path_factory.mktemp("alerts"),
        config_overrides=CONFIG,
        consumer=CONSUMER,
        shard=MAIN_SHARD,
    ).install()
    yield created
    with kube.admin_client() as client:
        rest = Rest(client)
        for name in (MAIN_SHARD, DOWN_SHARD):
            try:
                rest.delete(SHARDS, name)
            except Exception:  # noqa: BLE001 - already gone
                pass


@pytest.fixture(scope="module")
def rest(kube: KubeControlPlane) -> Iterator[Rest]:
    with kube.admin_client() as client:
        yield Rest(client)


class Topologies:
    """The Prometheus servers of the test, all scraping the same manager."""

    def __init__(self, workdir: Path, target: str) -> None:
        rules = {"dbprovider.rules.yaml": _rule_file()}
        evaluation = {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE}
        self.central = PrometheusServer(workdir / "central", {"global": evaluation}, rules, remote_write_receiver=True)
        self.central.start()
        self.agent = PrometheusServer(
            workdir / "agent",
            {
                "global": {"scrape_interval": SCRAPE, "external_labels": {"cluster": CLUSTER}},
                "scrape_configs": [_scrape_job(target)],
                "remote_write": [
                    {
                        "url": f"{self.central.url}/api/v1/write",
                        "queue_config": {"batch_send_deadline": "500ms", "min_backoff": "100ms", "max_backoff": "1s"},
                    }
                ],
            },
            agent=True,
        )
        # Server mode as docs/operations.md tells users: the scrape job sets `cluster` on the series (the
        # relabeling of the rendered ServiceMonitor, in plain Prometheus configuration).
        self.server = PrometheusServer(
            workdir / "server",
            {
                "global": {**evaluation, "external_labels": {"cluster": CLUSTER}},
                "scrape_configs": [_scrape_job(target, CLUSTER)],
            },
            rules,
        )
        # The mistake of the issue: `cluster` only as an external label.
        self.misconfigured = PrometheusServer(
            workdir / "misconfigured",
            {
                "global": {**evaluation, "external_labels": {"cluster": CLUSTER}},
                "scrape_configs": [_scrape_job(target)],
            },
            rules,
        )
        for server in (self.agent, self.server, self.misconfigured):
            server.start()

    @property
    def evaluating(self) -> dict[str, PrometheusServer]:
        return {"agent+central": self.central, "server": self.server}

    def close(self) -> None:
        for server in (self.agent, self.server, self.misconfigured, self.central):
            server.close()


def _active(server: PrometheusServer) -> set[str]:
    return {alert["labels"]["alertname"] for alert in server.alerts()}


def _wait_alerts(
    topologies: Topologies, check: Callable[[PrometheusServer], bool], what: str, timeout: float = ALERT_TIMEOUT
) -> None:
    for name, server in topologies.evaluating.items():
        try:
            wait_for(lambda s=server: check(s), timeout=timeout, what=f"{name}: {what}")
        except AssertionError as exc:
            states = sorted((a["labels"]["alertname"], a["state"], str(a["labels"])) for a in server.alerts())
            raise AssertionError(f"{exc}; alerts: {states}") from None


def _only(alerts: dict[str, list[dict[str, Any]]], name: str, **labels: str) -> dict[str, Any]:
    matching = [a for a in alerts.get(name, []) if all(a["labels"].get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, alerts.get(name))
    return matching[0]


EXPECTED_FAULT_ALERTS = {
    "DBProviderShardNotReady": {"shard": DOWN_SHARD},  # per shard; the reason is in the description
    "DBProviderShardNearCapacity": {"shard": MAIN_SHARD},
    "DBProviderDatabaseFailed": {"shard": "unplaced"},
    "DBProviderDeletionHeld": {"shard": MAIN_SHARD},
    "DBProviderDatabaseStuckProvisioning": {"shard": MAIN_SHARD},
    "DBProviderReconcileErrors": {"controller": "database", "reason": "CredentialsSecretConflict"},
}


def _all_fault_alerts_firing(server: PrometheusServer) -> bool:
    firing = _firing(server)
    return all(
        any(all(a["labels"].get(k) == v for k, v in labels.items()) for a in firing.get(name, []))
        for name, labels in EXPECTED_FAULT_ALERTS.items()
    )


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(dbprovider_[a-z_]+|up)\s*\{", expr))


def _has_data(server: PrometheusServer, query: str, start: float, end: float) -> bool:
    data = server.api("query_range", query=query, start=start, end=end, step="1s")
    return any(not math.isnan(float(value)) for series in data["result"] for _, value in series["values"])


def _expand(query: str) -> str:
    return query.replace("$cluster", CLUSTER).replace("$shard", ".*").replace("$__rate_interval", "10s")


def test_every_alert_fires_on_a_real_cause_and_clears_in_both_topologies(
    stack: DevStack, rest: Rest, postgres_pool, tmp_path: Path
) -> None:
    started = time.time()
    replica = Replica(stack, "alerttest-a", TIME_SCALE)
    replica.start()
    topologies = Topologies(tmp_path, replica.target)
    try:
        _drive_faults_and_check(stack, rest, replica, topologies, postgres_pool.get("18").port, started)
    finally:
        topologies.close()
        replica.stop()


def _drive_faults_and_check(
    stack: DevStack, rest: Rest, replica: Replica, topologies: Topologies, pg_port: int, started: float
) -> None:
    # Nothing fires on a healthy install; the misconfigured server reports the missing label instead of
    # a provider that is down.
    wait_for(lambda: _scraped_up(topologies.central), timeout=60, what="remote-written up series")
    for name, server in topologies.evaluating.items():
        assert not _firing(server), (name, server.alerts())

    # The causes.
    rest.patch(SHARDS, MAIN_SHARD, {"spec": {"maxDatabases": 3}})
    _down_shard(rest, stack)
    for external_id in ("kept", "held"):
        assert replica.call("PUT", f"/v1/databases/{external_id}").status_code == 201
    for external_id in ("kept", "held"):
        _wait_phase(rest, database_object_name(CONSUMER, external_id), "Ready")
    stuck = database_object_name(CONSUMER, "stuck")
    rest.create(SECRETS, _foreign_secret(f"{stuck}-credentials"), NAMESPACE)
    assert replica.call("PUT", "/v1/databases/stuck").status_code == 201
    wait_for(lambda: (_get_db(rest, stuck) or {}).get("status", {}).get("shard") == MAIN_SHARD, what="stuck placed")
    assert replica.call("PUT", "/v1/databases/overflow").status_code == 201
    _wait_phase(rest, database_object_name(CONSUMER, "overflow"), "Failed")
    rest.delete(DATABASES, database_object_name(CONSUMER, "held"), NAMESPACE)  # no delete annotation: held

    _wait_alerts(topologies, _all_fault_alerts_firing, "every fault alert firing")
    wait_for(
        lambda: "DBProviderClusterLabelMissing" in _firing(topologies.misconfigured),
        timeout=ALERT_TIMEOUT,
        what="the guard on the misconfigured server",
    )
    assert "DBProviderDown" not in _active(topologies.misconfigured)

    for name, server in topologies.evaluating.items():
        firing = _firing(server)
        assert "DBProviderDown" not in firing and "DBProviderClusterLabelMissing" not in firing, name
        for alertname, labels in EXPECTED_FAULT_ALERTS.items():
            alert = _only(firing, alertname, **labels)
            assert alert["labels"]["cluster"] == CLUSTER
            assert alert["labels"]["namespace"] == NAMESPACE
            assert alert["annotations"]["runbook_url"].endswith(f"docs/operations.md#{alertname.lower()}")
        described = {
            n: _only(firing, n, **labels)["annotations"]["description"] for n, labels in EXPECTED_FAULT_ALERTS.items()
        }
        assert "reason Unreachable" in described["DBProviderShardNotReady"]
        assert "has been 100% full" in described["DBProviderShardNearCapacity"]
        assert described["DBProviderDatabaseFailed"].startswith(f"1 database(s) in namespace {NAMESPACE}")
        assert "reason NoCapacity (1)" in described["DBProviderDatabaseFailed"]
        assert "reason" not in _only(firing, "DBProviderShardNotReady", shard=DOWN_SHARD)["labels"]
        assert described["DBProviderDeletionHeld"].startswith(f"1 database(s) in namespace {NAMESPACE}")
        assert "reason CredentialsSecretConflict" in described["DBProviderReconcileErrors"]
        assert "by Ready reason: CredentialsSecretConflict (1)." in described["DBProviderDatabaseStuckProvisioning"]

        # Every rule evaluates cleanly and every series it reads exists.
        rules = server.rules()
        assert rules and all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
        for rule in rules:
            for metric in _metric_names(rule["query"]):
                assert server.api("series", **{"match[]": f'{metric}{{job="{JOB}", cluster="{CLUSTER}"}}'}), (
                    name,
                    metric,
                )

    # No `*_created` series from the manager.
    assert "_created" not in requests.get(f"http://{replica.target}/metrics", timeout=10).text

    # Every dashboard panel's query returns data (template variables expanded). Rate panels need a
    # counter that grew between two scrapes, so API traffic goes on while the queries are polled.
    def panel_has_data(query: str) -> bool:
        replica.call("GET", "/v1/databases")
        return _has_data(topologies.server, _expand(query), started, time.time())

    for title, queries in dashboard_panels(stack.config):
        for query in queries:
            wait_for(lambda q=query: panel_has_data(q), timeout=30, what=f"data for panel {title!r}: {query}")

    # Clearing the causes clears the alerts.
    rest.patch(SHARDS, DOWN_SHARD, {"spec": {"admin": {"port": pg_port}}})
    rest.patch(SHARDS, MAIN_SHARD, {"spec": {"maxDatabases": 100}})
    rest.delete(SECRETS, f"{stuck}-credentials", NAMESPACE)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rest.patch(
        DATABASES,
        database_object_name(CONSUMER, "held"),
        {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: stamp}}},
        NAMESPACE,
    )
    _wait_alerts(topologies, lambda s: not (_active(s) & set(EXPECTED_FAULT_ALERTS)), "every fault alert cleared")

    # The manager stopped: DBProviderDown; started again: cleared.
    replica.stop()
    _wait_alerts(topologies, lambda s: "DBProviderDown" in _firing(s), "DBProviderDown firing")
    for name, server in topologies.evaluating.items():
        down = _only(_firing(server), "DBProviderDown")
        assert down["labels"]["cluster"] == CLUSTER and down["labels"]["job"] == JOB, name
    replica.start()
    _wait_alerts(topologies, lambda s: "DBProviderDown" not in _active(s), "DBProviderDown cleared")


def _scraped_up(server: PrometheusServer) -> bool:
    return bool(server.api("query", query=f'up{{job="{JOB}", cluster="{CLUSTER}"}} == 1')["result"])


def _down_shard(rest: Rest, stack: DevStack) -> None:
    """A shard whose admin port has nothing listening: Ready=False, reason Unreachable.

    It does not accept databases, so the overflow database below meets a real lack of capacity
    (NoCapacity, Failed) rather than a shard that may come back (ShardsUnavailable)."""
    rest.create(
        SHARDS,
        {
            "apiVersion": API_VERSION,
            "kind": "Shard",
            "metadata": {"name": DOWN_SHARD},
            "spec": {
                "maxDatabases": 100,
                "accepting": False,
                "perconaCluster": {"namespace": NAMESPACE, "name": DOWN_SHARD},
                # The main shard's admin Secret (listed in shardSecrets) and TLS settings; only the port is wrong.
                "admin": {
                    "serviceName": f"{DOWN_SHARD}-primary",
                    "port": free_port(),
                    "sslmode": "require",
                    "secretRef": {"namespace": stack.shard_secrets_namespace, "name": stack.admin_secret},
                },
                "client": {"host": "127.0.0.1", "port": stack.postgres.port, "sslmode": "require"},
            },
        },
    )


def _foreign_secret(name: str) -> dict[str, Any]:
    """A Secret with the credentials Secret's name that the provider did not write: never overwritten."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"note": b64("someone else's")},
    }


def _get_db(rest: Rest, name: str) -> dict[str, Any] | None:
    try:
        return rest.get(DATABASES, name, NAMESPACE)
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise


def _wait_phase(rest: Rest, name: str, phase: str) -> None:
    wait_for(
        lambda: ((_get_db(rest, name) or {}).get("status") or {}).get("phase") == phase,
        timeout=60,
        what=f"{name} {phase}",
    )
