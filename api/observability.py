"""Request metrics and the structured access log of the API.

Metrics go on a registry passed in (the manager serves it on :8080):
- dbprovider_api_requests_total{method, route, code}
- dbprovider_api_request_duration_seconds{method, route} (histogram)
`route` is the route template (`/v1/databases/{externalId}`), `unmatched` for unknown paths, so neither
an externalId nor a consumer ever becomes a label value.

The access log is one JSON object per request on logger `api.access`: method, route template, status,
duration and the consumer's name. Never the Authorization header, a token, a hash or a password.
"""

from __future__ import annotations

import json
import logging
import time

import falcon
from prometheus_client import CollectorRegistry, Counter, Histogram

from domain.settings import SETTINGS

access_log = logging.getLogger("api.access")

UNMATCHED_ROUTE = "unmatched"
KNOWN_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "PATCH"})
# Probes (every few seconds) are logged at debug level only.
QUIET_ROUTES = frozenset({SETTINGS.probes.liveness, SETTINGS.probes.readiness})
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """The API's two metric families, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "dbprovider_api_requests",
            "API requests by method, route template and status code.",
            ["method", "route", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "dbprovider_api_request_duration_seconds",
            "API request latency by method and route template.",
            ["method", "route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        self.requests.labels(method, route, str(code)).inc()
        self.duration.labels(method, route).observe(seconds)


class ObservabilityMiddleware:
    """Times every request, counts it by route template and writes the access log line.

    Registered first, so its `process_response` runs last and sees the final status, errors included.
    """

    def __init__(self, metrics: ApiMetrics) -> None:
        self.metrics = metrics

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.perf_counter()

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        started = getattr(req.context, "started", None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        method = req.method if req.method in KNOWN_METHODS else "other"
        route = req.uri_template or UNMATCHED_ROUTE
        code = resp.status_code
        self.metrics.observe(method, route, code, seconds)
        level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
        if access_log.isEnabledFor(level):
            fields = {
                "event": "api_request",
                "method": method,
                "route": route,
                "status": code,
                "durationSeconds": round(seconds, 6),
                "consumer": getattr(req.context, "consumer", None),
            }
            access_log.log(level, json.dumps(fields, sort_keys=True), extra={"http": fields})
