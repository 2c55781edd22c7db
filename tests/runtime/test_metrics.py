"""The metrics endpoint serves the reconcile counters over real HTTP and frees its port on stop."""

from __future__ import annotations

import socket
import urllib.request

from informers import CONFIGMAPS, Rest
from reconciler.runtime import (
    Controller,
    ExponentialBackoff,
    ReconcileError,
    Result,
    RuntimeMetrics,
    WorkQueue,
    start_metrics_server,
)
from tests.runtime.support import configmap
from tests.support.common import wait_for


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def test_metrics_endpoint_serves_both_counters_and_stop_frees_the_port(admin_rest: Rest, namespace: str) -> None:
    admin_rest.create(CONFIGMAPS, configmap("cm", namespace, {"v": "1"}))
    stale = admin_rest.get(CONFIGMAPS, "cm", namespace)
    admin_rest.patch(CONFIGMAPS, "cm", {"data": {"v": "2"}}, namespace)
    attempts: list[str] = []

    def reconcile(key: str) -> Result:
        attempts.append(key)
        if len(attempts) == 1:
            admin_rest.replace(CONFIGMAPS, stale)  # stale resourceVersion: a real 409
        if len(attempts) == 2:
            raise ReconcileError("AdminUnavailable", "connection refused")
        return Result()

    metrics = RuntimeMetrics()
    server = start_metrics_server(0, metrics.registry, addr="127.0.0.1")
    queue = WorkQueue(ExponentialBackoff(base=0.01, max_delay=0.1))  # quick retries
    controller = Controller("database", reconcile, queue=queue, metrics=metrics)
    try:
        controller.start()
        controller.enqueue(f"{namespace}/cm")
        wait_for(lambda: len(attempts) == 3, timeout=10)
        body = _scrape(server.port)
        assert 'dbprovider_reconcile_conflicts_total{controller="database"} 1.0' in body
        errors = 'dbprovider_reconcile_errors_total{controller="database",reason='
        assert errors + '"AdminUnavailable",retryable="true"} 1.0' in body
        assert errors + '"Other",retryable="true"} 0.0' in body
        assert errors + '"Other",retryable="false"} 0.0' in body
        assert "# TYPE dbprovider_reconcile_errors_total counter" in body
        assert 'dbprovider_reconciles_total{controller="database"} 3.0' in body  # every pass, whatever it did
    finally:
        controller.stop()
        server.stop()

    with socket.socket() as sock:  # nothing listens any more
        assert sock.connect_ex(("127.0.0.1", server.port)) != 0
    again = start_metrics_server(server.port, metrics.registry, addr="127.0.0.1")  # the port is free again
    try:
        assert "dbprovider_reconcile_conflicts_total" in _scrape(again.port)
    finally:
        again.stop()
