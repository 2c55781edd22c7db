"""The agent's Prometheus metrics, and its one HTTP port: /metrics, /healthz and /readyz (plain HTTP).

What a consumer cluster's SRE watches: the claims by phase and by condition (read from the agent's
cache at scrape time), the provider's answers by route and outcome, when the agent last heard from
the provider, and what it wrote (Secrets, claim statuses, Deployment rollouts). Every replica serves
them; the passes, the writes and the last sync are the leader's (`dbprovider_agent_leader` says which).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.settings import SETTINGS
from domain.timefmt import parse_time

UNREACHABLE = "unreachable"  # the provider's outcome label when it did not answer


def route_label(method: str, path: str) -> str:
    """`GET /v1/databases/{id}/credentials`: the route with the database's id left out (bounded labels)."""
    parts = path.split("?", 1)[0].split("/")
    if len(parts) > 3 and parts[:3] == ["", "v1", "databases"]:
        parts[3] = "{id}"
    return f"{method} {'/'.join(parts)}"


class AgentMetrics:
    """The agent's metrics in a registry of their own (nothing is registered at import time)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.provider_requests = Counter(
            "dbprovider_agent_provider_requests_total",
            "Requests to the provider's API by route and outcome (the HTTP status, or unreachable).",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.passes = Counter(
            "dbprovider_agent_passes_total",
            "Passes over the claims (outcome synced: the provider answered; provider_away; failed: a bug, logged).",
            ["outcome"],
            registry=self.registry,
        )
        self.last_sync = Gauge(
            "dbprovider_agent_last_sync_timestamp_seconds",
            "When the agent last heard from the provider in a pass (Unix time; 0: not yet).",
            registry=self.registry,
        )
        self.secret_writes = Counter(
            "dbprovider_agent_secret_writes_total",
            "Writes of claims' Secrets (create, update: new values; release: Orphan; delete).",
            ["action"],
            registry=self.registry,
        )
        self.secret_write_failures = Counter(
            "dbprovider_agent_secret_write_failures_total",
            "Writes of claims' Secrets the consumer cluster's apiserver refused or did not answer (by action; "
            "write conflicts, retried at once, are not counted).",
            ["action"],
            registry=self.registry,
        )
        self.status_writes = Counter(
            "dbprovider_agent_claim_status_writes_total",
            "Writes of claims' status (only when something in it changed).",
            registry=self.registry,
        )
        self.rollouts = Counter(
            "dbprovider_agent_deployment_rollouts_total",
            "Deployments named by claims' rolloutDeployments, rolled for new Secret values (outcome rolled, "
            "not_found, forbidden).",
            ["outcome"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "dbprovider_agent_leader",
            "1 while this replica holds the Lease and runs the passes.",
            registry=self.registry,
        )
        for outcome in ("synced", "provider_away", "failed"):
            self.passes.labels(outcome=outcome)
        for action in ("create", "update", "release", "delete"):
            self.secret_writes.labels(action=action)
            self.secret_write_failures.labels(action=action)
        for outcome in ("rolled", "not_found", "forbidden"):
            self.rollouts.labels(outcome=outcome)

    def observe_request(self, method: str, path: str, outcome: str) -> None:
        self.provider_requests.labels(route=route_label(method, path), outcome=outcome).inc()


class ClaimsCollector(Collector):
    """`dbprovider_agent_claims{phase}`, `dbprovider_agent_claim_conditions{type,status,reason}` and
    `dbprovider_agent_claims_not_ready_since_timestamp_seconds` from the claims in the agent's cache, counted
    at scrape time."""

    def __init__(self, claims: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self.claims = claims

    def collect(self) -> Iterator[GaugeMetricFamily]:
        phases: Tally[str] = Tally()
        conditions: Tally[tuple[str, str, str]] = Tally()
        waiting: list[float] = []
        for claim in self.claims():
            status = claim.get("status") or {}
            phases[str(status.get("phase") or "Unknown")] += 1
            for condition in status.get("conditions") or []:
                key = (str(condition.get("type")), str(condition.get("status")), str(condition.get("reason") or ""))
                conditions[key] += 1
            since = _not_ready_since(claim)
            if since is not None:
                waiting.append(since)
        by_phase = GaugeMetricFamily(
            "dbprovider_agent_claims", "DatabaseClaims the agent watches, by status.phase.", labels=["phase"]
        )
        for phase, count in sorted(phases.items()):
            by_phase.add_metric([phase], count)
        by_condition = GaugeMetricFamily(
            "dbprovider_agent_claim_conditions",
            "DatabaseClaims by condition type, status and reason.",
            labels=["type", "status", "reason"],
        )
        for labels, count in sorted(conditions.items()):
            by_condition.add_metric(list(labels), count)
        yield by_phase
        yield by_condition
        oldest = GaugeMetricFamily(
            "dbprovider_agent_claims_not_ready_since_timestamp_seconds",
            "Since when the claim that has waited longest is not Ready (its Ready condition's last transition, "
            "else its creation; Unix time). No sample while every claim is Ready or being deleted.",
        )
        if waiting:
            oldest.add_metric([], min(waiting))
        yield oldest


def _not_ready_since(claim: Mapping[str, Any]) -> float | None:
    """When a live claim stopped being Ready (or was created, before its first Ready condition); None if it
    is Ready or being deleted."""
    meta = claim.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    conditions = (claim.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") == "True":
        return None
    stamp = parse_time((ready or {}).get("lastTransitionTime") or meta.get("creationTimestamp"))
    return stamp.timestamp() if stamp is not None else None


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds are not news."""


class AgentEndpoint:
    """/metrics from `registry`; /healthz answers 200 while `live()`, /readyz while `ready()` (else 503)."""

    def __init__(
        self, port: int, registry: CollectorRegistry, live: Callable[[], bool], ready: Callable[[], bool], host: str
    ) -> None:
        metrics_app = make_wsgi_app(registry)
        checks = {SETTINGS.probes.liveness: live, SETTINGS.probes.readiness: ready}

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            check = checks.get(environ.get("PATH_INFO", ""))
            if check is None:
                served: Iterable[bytes] = metrics_app(environ, start_response)
                return served
            good = check()
            body = b"ok\n" if good else b"not ok\n"
            start_response("200 OK" if good else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [body]

        self._server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-endpoint", daemon=True)

    def start(self) -> AgentEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
