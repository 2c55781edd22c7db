"""The provider's consumer API as the agent calls it: HTTPS with the consumer's bearer token.

The token is read from its file on every request, so a rotated token (a mounted Secret the kubelet
updated) is used without a restart; the CA file is re-read when its modification time changes. The
list is conditional (`If-None-Match`): while nothing changed the provider answers 304 and the agent
keeps what it last read. Errors carry the HTTP status, the API's error code and Retry-After, never a
body, a token or a password.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

USER_AGENT = "dbprovider-agent"
DEFAULT_TIMEOUT = 10.0

View = dict[str, Any]
QUOTA_EXCEEDED = "quota_exceeded"  # a 429 that is an answer, not a busy provider


class ProviderError(Exception):
    """The provider answered with an error status: `status`, the API's `code`, its Retry-After (seconds)."""

    def __init__(self, status: int, code: str, retry_after: float | None = None) -> None:
        super().__init__(f"provider answered {status} {code}")
        self.status = status
        self.code = code
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth retrying as is: the provider is busy or away (5xx, 429 but for a reached quota)."""
        return (self.status == 429 and self.code != QUOTA_EXCEEDED) or self.status >= 500


class ProviderUnreachable(Exception):
    """No answer from the provider (connection, TLS, timeout); the message is the error class only."""


@dataclass(frozen=True)
class ListAnswer:
    """A list poll: the tag to send next time, and the databases by externalId (None: unchanged, 304)."""

    etag: str | None
    items: dict[str, View] | None


class Provider:
    """One provider API (`url`, e.g. https://dbprovider.example:8443), called as one consumer."""

    def __init__(
        self,
        url: str,
        token_file: str | Path,
        ca_file: str | Path | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        on_answer: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token_file = Path(token_file)
        self.ca_file = Path(ca_file) if ca_file else None
        self.timeout = timeout
        self.requests = 0  # requests sent (observability, the benchmark)
        # Told (method, path, outcome) of every request: the HTTP status, or "unreachable" (the metrics).
        self.on_answer = on_answer
        self._lock = threading.Lock()
        self._ca_stamp: float | None = None
        self._pool: urllib3.PoolManager | None = None

    # -- routes ----------------------------------------------------------------------------------

    def list(self, etag: str | None) -> ListAnswer:
        """GET /v1/databases, conditional on `etag`."""
        headers = {"If-None-Match": etag} if etag else {}
        status, body, answer_headers = self._call("GET", "/v1/databases", headers=headers, ok=(200, 304))
        new_tag = answer_headers.get("ETag", etag)
        if status == 304:
            return ListAnswer(new_tag, None)
        return ListAnswer(new_tag, {item["externalId"]: item for item in body.get("items", [])})

    def ensure(self, external_id: str, size_class: str) -> View:
        """PUT /v1/databases/{id}: create the database, or the existing one's view."""
        body = {"sizeClass": size_class} if size_class else {}
        return self._call("PUT", f"/v1/databases/{external_id}", body=body, ok=(200, 201))[1]

    def delete(self, external_id: str) -> View | None:
        """DELETE /v1/databases/{id}: start the soft delete; None if the provider has no such database (404,
        or 410: dropped)."""
        try:
            return self._call("DELETE", f"/v1/databases/{external_id}", ok=(202,))[1]
        except ProviderError as exc:
            if exc.status in (404, 410):
                return None
            raise

    def undelete(self, external_id: str) -> View:
        """POST /v1/databases/{id}/undelete: withdraw the delete of a database not dropped yet (if allowed)."""
        return self._call("POST", f"/v1/databases/{external_id}/undelete", body={}, ok=(202,))[1]

    def credentials(self, external_id: str) -> dict[str, Any]:
        """GET /v1/databases/{id}/credentials."""
        return self._call("GET", f"/v1/databases/{external_id}/credentials", ok=(200,))[1]

    def rotate(self, external_id: str, overlap_seconds: int = 0) -> View:
        """POST /v1/databases/{id}/credentials/rotate; the old credentials keep working `overlap_seconds`
        after the new ones are handed out (0: until the new password is in effect)."""
        body = {"overlapSeconds": overlap_seconds}
        return self._call("POST", f"/v1/databases/{external_id}/credentials/rotate", body=body, ok=(202,))[1]

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.clear()
                self._pool = None

    # -- transport -------------------------------------------------------------------------------

    def _token(self) -> str:
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ProviderUnreachable(f"token file unreadable ({type(exc).__name__})") from None
        if not token:
            raise ProviderUnreachable("token file is empty")
        return token

    def _connection_pool(self) -> urllib3.PoolManager:
        """The pool, rebuilt when the CA file changed (a renewed provider CA is trusted without a restart)."""
        stamp = None
        if self.ca_file is not None:
            try:
                stamp = os.stat(self.ca_file).st_mtime
            except OSError:
                stamp = None
        with self._lock:
            if self._pool is None or stamp != self._ca_stamp:
                context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                if self._pool is not None:
                    self._pool.clear()
                self._pool = urllib3.PoolManager(maxsize=4, ssl_context=context, retries=False)
                self._ca_stamp = stamp
            return self._pool

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...],
    ) -> tuple[int, dict[str, Any], Mapping[str, str]]:
        all_headers = {"Authorization": f"Bearer {self._token()}", "User-Agent": USER_AGENT, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        self.requests += 1
        try:
            response = self._connection_pool().request(
                method, self.url + path, body=data, headers=all_headers, timeout=self.timeout, redirect=False
            )
        except (urllib3.exceptions.HTTPError, OSError, ssl.SSLError) as exc:
            self._answered(method, path, "unreachable")
            raise ProviderUnreachable(type(exc).__name__) from None
        self._answered(method, path, str(response.status))
        answer_headers = response.headers  # case-insensitive
        if response.status not in ok:
            raise ProviderError(response.status, _error_code(response.data), _retry_after(answer_headers))
        if response.status == 304 or not response.data:
            return response.status, {}, answer_headers
        try:
            decoded = json.loads(response.data)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise ProviderUnreachable("the provider answered with a body that is not a JSON object")
        return response.status, decoded, answer_headers

    def _answered(self, method: str, path: str, outcome: str) -> None:
        if self.on_answer is not None:
            self.on_answer(method, path, outcome)


def _error_code(raw: bytes) -> str:
    try:
        code = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return "unknown"
    return code if isinstance(code, str) and code.isascii() and len(code) <= 64 else "unknown"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())
