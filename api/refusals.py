"""What the front door refuses, drops and answers in its own name: counted by reason and logged.

Metrics, on the registry passed in (the manager's, served on :8080):
- dbprovider_api_connections_open
- dbprovider_api_connections_refused_total{limit}: connections closed at accept (maxConnections,
  maxConnectionsPerClient) and connections evicted to make room (evicted);
- dbprovider_api_connections_dropped_total{reason}: a deadline broken (headerTimeout, bodyTimeout,
  sendTimeout, parkedTimeout), a TLS handshake that failed (tlsHandshake), or a client that went on
  sending after its request was refused, held for the header deadline (sendingAfterRefusal); idle
  keep-alive connections closed after idleTimeout are not counted, that is their normal end;
- dbprovider_api_requests_refused_total{reason}: answers of the front door itself: the framing codes
  of api/http1.py (400/413/431/505), consumerConcurrency (429), requestTimeout and probeTimeout (503);
- dbprovider_api_accept_errors_total{errno}: accept() failures such as EMFILE.

Every such event is logged with the client address at INFO (framing, deadlines) or WARNING (bounds,
accept errors, app deadlines): the first of a kind at once, then at most one line per kind every
LOG_INTERVAL seconds, with the number of events since. Label values come from fixed sets: never an
address, a consumer or a path.
"""

from __future__ import annotations

import errno as errno_codes
import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("api.server")

LOG_INTERVAL = 10.0
CONNECTION_LIMITS = ("maxConnections", "maxConnectionsPerClient", "evicted")
DROP_REASONS = ("headerTimeout", "bodyTimeout", "sendTimeout", "parkedTimeout", "tlsHandshake", "sendingAfterRefusal")
REQUEST_REASONS = (
    "requestLine",
    "version",
    "lineEnd",
    "headerField",
    "contentLength",
    "transferEncoding",
    "host",
    "chunk",
    "trailer",
    "headersTooLarge",
    "bodyTooLarge",
    "tooManyChunks",
    "consumerConcurrency",
    "requestTimeout",
    "probeTimeout",
)
ACCEPT_ERRNOS = ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM")  # exported from the start; others appear when seen


class RateLimitedLog:
    """One log line per kind at once, then at most one every `interval` seconds with a count (thread-safe)."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            self._since[kind] = self._since.get(kind, 0) + 1
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                return
            count = self._since.pop(kind)
            self._last[kind] = now
        log.log(level, message + " (%d such events since the last such message)", *args, count)


def _counter_by(
    label: str, values: tuple[str, ...], name: str, documentation: str, registry: CollectorRegistry
) -> Counter:
    """A counter with one label, every value of which is exported as 0 from the start (so that rate()
    and the dashboard see every series before the first event)."""
    counter = Counter(name, documentation, [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class FrontDoorEvents:
    """The front door's counters and its rate-limited log (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.log = RateLimitedLog()
        self.open = Gauge("dbprovider_api_connections_open", "Open API connections.", registry=registry)
        self.refused = _counter_by(
            "limit",
            CONNECTION_LIMITS,
            "dbprovider_api_connections_refused",
            "API connections closed at accept because a connection bound was reached, or evicted to make room.",
            registry,
        )
        self.dropped = _counter_by(
            "reason",
            DROP_REASONS,
            "dbprovider_api_connections_dropped",
            "API connections closed without an answer: a deadline broken or a failed TLS handshake.",
            registry,
        )
        self.requests_refused = _counter_by(
            "reason",
            REQUEST_REASONS,
            "dbprovider_api_requests_refused",
            "Requests answered by the front door itself: framing errors, bounds and deadlines.",
            registry,
        )
        self.accept_errors = _counter_by(
            "errno",
            ACCEPT_ERRNOS,
            "dbprovider_api_accept_errors",
            "accept() failures of the API's listener, by errno.",
            registry,
        )

    def connection_refused(self, limit: str, client: str, why: str) -> None:
        self.refused.labels(limit).inc()
        self.log.log(logging.WARNING, f"refused:{limit}", "API connection refused from %s: %s", client, why)

    def connection_dropped(self, reason: str, client: str) -> None:
        self.dropped.labels(reason).inc()
        self.log.log(logging.INFO, f"dropped:{reason}", "API connection from %s dropped: %s", client, reason)

    def request_refused(self, reason: str, status: int, client: str, why: str) -> None:
        self.requests_refused.labels(reason if reason in REQUEST_REASONS else "requestLine").inc()
        level = logging.WARNING if status >= 500 or status == 429 else logging.INFO
        self.log.log(level, f"request:{reason}", "API request from %s answered %d: %s", client, status, why)

    def accept_failed(self, exc: OSError) -> None:
        name = errno_codes.errorcode.get(exc.errno or 0, "other")
        self.accept_errors.labels(name).inc()
        self.log.log(logging.WARNING, f"accept:{name}", "API accept failed: %s (errno %s)", name, exc.errno)
