"""The process' Prometheus registry, the reconcile counters, and the /metrics HTTP server.

Create one `RuntimeMetrics` in the composition root and register every other metric of the
process (API, shard gauges) in `metrics.registry`; nothing is registered at import time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily

OTHER_REASON = "Other"


def shard_gauges(shards: Iterable[str], *gauges: tuple[str, str, Callable[[str], float]]) -> list[GaugeMetricFamily]:
    """One gauge family per (name, help, value of a shard), labelled `shard`, with a sample for every
    shard in `shards` order: the shape of every per-shard gauge the collectors export."""
    shards = list(shards)
    families = []
    for name, documentation, value_of in gauges:
        family = GaugeMetricFamily(name, documentation, labels=["shard"])
        for shard in shards:
            family.add_metric([shard], value_of(shard))
        families.append(family)
    return families


def retryable_label(retryable: bool) -> str:
    """The `retryable` label value: "true" (retried with backoff) or "false" (a TerminalError)."""
    return "true" if retryable else "false"


class RuntimeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reconcile_errors = Counter(
            "dbprovider_reconcile_errors_total",
            "Failed reconciles (reason = the condition reason of a ReconcileError, else Other; "
            "retryable = false for a TerminalError, not retried with backoff).",
            ["controller", "reason", "retryable"],
            registry=self.registry,
        )
        self.reconciles = Counter(
            "dbprovider_reconciles_total",
            "Reconciles run (passes over one key), whatever their outcome.",
            ["controller"],
            registry=self.registry,
        )
        self.reconcile_conflicts = Counter(
            "dbprovider_reconcile_conflicts_total",
            "Write conflicts (HTTP 409), requeued with backoff and not counted as errors.",
            ["controller"],
            registry=self.registry,
        )

    def init_controller(self, controller: str) -> None:
        """Export zero-valued series for a controller so rate() and alerts see it from the start."""
        self.reconciles.labels(controller=controller)
        self.reconcile_conflicts.labels(controller=controller)
        for retryable in (True, False):
            self.reconcile_errors.labels(
                controller=controller, reason=OTHER_REASON, retryable=retryable_label(retryable)
            )


class MetricsServer:
    """A running /metrics endpoint; `stop()` closes the listening socket (the port is free again)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port: int = server.server_address[1]

    def stop(self, timeout: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)


def start_metrics_server(port: int, registry: CollectorRegistry, addr: str = "0.0.0.0") -> MetricsServer:  # noqa: S104 - the Service routes to it
    """Serve `registry` on http://addr:port/metrics from a daemon thread (port 0 = a free port)."""
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)
