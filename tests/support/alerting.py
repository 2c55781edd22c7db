"""A real manager scraped by a real Prometheus that evaluates the rendered alert rules, with time
compressed (the alert and patroni suites).

The rules are rendered with the documented test-only option (`--test-time-scale N`: `for: 15m` is
15 min / N) and the manager's backoff cap is cut by the same factor, so an alert's real cause makes
it fire within seconds.
"""

from __future__ import annotations

from typing import Any

import requests
import yaml

from dbprovider.devstack import DevStack
from dbprovider.manager import Manager, ManagerOptions
from domain.admin_access import OutsidePod
from domain.config import load_install_config
from harness.manager_endpoints import ManagerEndpoints
from harness.prometheus import PrometheusServer
from infra.render import render_prometheus_rule, rule_groups
from tests.support.common import wait_for


class Replica:
    """The manager, in this process, with the backoff cap scaled like the rules."""

    def __init__(self, stack: DevStack, identity: str, time_scale: int) -> None:
        self.endpoints = ManagerEndpoints()
        self.options = ManagerOptions(
            config=stack.config,
            namespace=stack.namespace,
            kubeconfig=str(stack.manager_kubeconfig),
            api_host="127.0.0.1",
            api_port=self.endpoints.api_port,
            metrics_host="127.0.0.1",
            metrics_port=self.endpoints.metrics_port,
            tls_cert=str(stack.tls_cert),
            tls_key=str(stack.tls_key),
            identity=identity,
            outside_pod=OutsidePod(admin_host="127.0.0.1"),
            lease_duration=4.0,
            renew_deadline=3.0,
            retry_period=0.5,
            shard_ping_interval=2.0,
            max_backoff=300 / time_scale,
        )
        self.stack = stack
        self.manager: Manager | None = None

    @property
    def target(self) -> str:
        return self.endpoints.metrics_target

    def start(self) -> None:
        self.manager = Manager(self.options).start()
        wait_for(self.manager.controllers.is_leading, timeout=30, what="the manager to lead")

    def stop(self) -> None:
        if self.manager is not None:
            self.manager.stop()
            self.manager = None

    def call(self, method: str, path: str) -> requests.Response:
        return requests.request(
            method,
            self.endpoints.url(path),
            headers={"Authorization": f"Bearer {self.stack.token}"},
            verify=str(self.stack.ca_file),
            timeout=10,
        )


def rule_file(config: dict[str, Any], time_scale: int) -> str:
    """Exactly what `dbprovider render --only prometheusrule --format rules --test-time-scale N` writes."""
    rule = render_prometheus_rule(load_install_config(config), time_scale=time_scale)
    return yaml.safe_dump(rule_groups(rule), sort_keys=False)


def scrape_job(job_name: str, target: str, interval: str, cluster: str = "") -> dict[str, Any]:
    """The job's scrape config; with `cluster`, the relabeling the ServiceMonitor renders (and the docs show)."""
    job: dict[str, Any] = {
        "job_name": job_name,
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "static_configs": [{"targets": [target]}],
    }
    if cluster:
        job["relabel_configs"] = [{"action": "replace", "target_label": "cluster", "replacement": cluster}]
    return job


def firing(server: PrometheusServer) -> dict[str, list[dict[str, Any]]]:
    """The firing alerts of `server` by name."""
    found: dict[str, list[dict[str, Any]]] = {}
    for alert in server.alerts():
        if alert["state"] == "firing":
            found.setdefault(alert["labels"]["alertname"], []).append(alert)
    return found
