"""Where a `dbprovider manager` started on loopback (by a test or a benchmark) answers.

A manager process gets two ports picked free before it starts: the consumer API (HTTPS, the
stack's CA) and /metrics (plain HTTP). Every suite and benchmark that starts one reached them the
same way; `ManagerEndpoints` is that one spelling.
"""

from __future__ import annotations

import requests

from harness.process import free_port


class ManagerEndpoints:
    """The two loopback ports of one manager (free ones unless given) and the URLs on them."""

    def __init__(self, api_port: int | None = None, metrics_port: int | None = None) -> None:
        self.api_port = api_port or free_port()
        self.metrics_port = metrics_port or free_port()

    def url(self, path: str) -> str:
        """`path` on the consumer API."""
        return f"https://127.0.0.1:{self.api_port}{path}"

    @property
    def metrics_target(self) -> str:
        """host:port of /metrics, as a Prometheus scrape config names it."""
        return f"127.0.0.1:{self.metrics_port}"

    def metrics(self, timeout: float = 10) -> str:
        """One scrape of /metrics, as text."""
        return requests.get(f"http://{self.metrics_target}/metrics", timeout=timeout).text
