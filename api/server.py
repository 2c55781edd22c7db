"""Serving the API over TLS with cheroot: a bounded thread pool, size limits and timeouts.

    server = ApiServer(app, "0.0.0.0", 8443, "/etc/dbprovider/tls/tls.crt", "/etc/dbprovider/tls/tls.key")
    server.start()     # binds (port 0 picks a free port: see server.port) and serves in a thread
    ...
    server.stop()      # stops accepting, finishes in-flight requests, frees the port

The certificate and key are files (the tls.secretName Secret mounted into the pod). They are re-read
when their modification time changes (checked at most every `reload_interval` seconds), so a renewed
certificate is served without a restart.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from cheroot import wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter

log = logging.getLogger(__name__)

DEFAULT_THREADS = 16
# cheroot's own guard; the app answers 413 from 16 KiB on (with metrics and a JSON body).
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_TIMEOUT = 15.0
DEFAULT_HANDSHAKE_TIMEOUT = 5.0
DEFAULT_SHUTDOWN_TIMEOUT = 10.0


class ReloadingSSLAdapter(BuiltinSSLAdapter):
    """cheroot's builtin TLS adapter: TLS 1.2+, a bounded handshake, and reloading of renewed files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        reload_interval: float = 10.0,
    ) -> None:
        super().__init__(cert_file, key_file)
        self._harden(self.context)
        self.handshake_timeout = handshake_timeout
        self.reload_interval = reload_interval
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        self._reload_lock = threading.Lock()

    @staticmethod
    def _harden(context: ssl.SSLContext) -> None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2

    def _file_stamp(self) -> tuple[float, float]:
        try:
            return (os.stat(self.certificate).st_mtime, os.stat(self.private_key).st_mtime)
        except OSError:
            return (0.0, 0.0)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_interval:
            return
        with self._reload_lock:
            if now - self._checked < self.reload_interval:
                return
            self._checked = now
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            try:
                context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(self.certificate, self.private_key)
            except (OSError, ssl.SSLError) as exc:  # half-written files: keep serving the old pair
                log.warning(
                    "TLS certificate changed but cannot be loaded yet (%s); keeping the old one", type(exc).__name__
                )
                return
            self._harden(context)
            self.context = context
            self._stamp = stamp
            log.info("TLS certificate reloaded")

    def wrap(self, sock: Any) -> Any:
        self._maybe_reload()
        # The handshake runs on cheroot's accepting thread: keep a silent client from holding it long.
        sock.settimeout(self.handshake_timeout)
        return super().wrap(sock)


class _Server(wsgi.Server):
    """cheroot's WSGI server with its error log routed to `logging` (it writes to stderr otherwise)."""

    def error_log(self, msg: str = "", level: int = logging.INFO, traceback: bool = False) -> None:
        # Connection-level noise (dropped TLS handshakes, plain HTTP on the TLS port) at debug level.
        log.log(logging.DEBUG if level < logging.ERROR else logging.ERROR, "cheroot: %s", msg, exc_info=traceback)


class ApiServer:
    """The API on cheroot with TLS. See the module docstring."""

    def __init__(
        self,
        app: Callable[..., Any],
        host: str = "0.0.0.0",
        port: int = 8443,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        *,
        threads: int = DEFAULT_THREADS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        queue_size: int | None = None,
        tls: bool = True,
    ) -> None:
        if tls and (cert_file is None or key_file is None):
            raise ValueError("cert_file and key_file are required (tls=False only for local experiments)")
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.app = app
        self.host = host
        self.requested_port = port
        self.cert_file = os.fspath(cert_file) if cert_file is not None else None
        self.key_file = os.fspath(key_file) if key_file is not None else None
        self.threads = threads
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.timeout = timeout
        self.handshake_timeout = handshake_timeout
        self.shutdown_timeout = shutdown_timeout
        self.queue_size = queue_size if queue_size is not None else threads * 4
        self.tls = tls
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> ApiServer:
        """Bind and serve in a background thread; raises OSError if the port cannot be bound."""
        if self._server is not None:
            return self
        server = _Server(
            (self.host, self.requested_port),
            self.app,
            numthreads=self.threads,
            max=self.threads,  # a fixed pool: no growth under load
            server_name="dbprovider",
            request_queue_size=128,
            timeout=self.timeout,
            shutdown_timeout=self.shutdown_timeout,
            accepted_queue_size=self.queue_size,  # beyond it cheroot answers 503 at once
            accepted_queue_timeout=1,
        )
        server.max_request_body_size = self.max_body_bytes
        server.max_request_header_size = self.max_header_bytes
        if self.tls:
            assert self.cert_file is not None and self.key_file is not None
            server.ssl_adapter = ReloadingSSLAdapter(
                self.cert_file, self.key_file, handshake_timeout=self.handshake_timeout
            )
        server.prepare()
        self.port = server.bind_addr[1]
        self._server = server
        self._thread = threading.Thread(target=self._serve, name="api-server", daemon=True)
        self._thread.start()
        mode = "TLS" if self.tls else "plain HTTP"
        log.info("API listening on %s:%s (%s, %d threads)", self.host, self.port, mode, self.threads)
        return self

    def _serve(self) -> None:
        assert self._server is not None
        try:
            self._server.serve()
        except Exception:  # noqa: BLE001 - reported, the manager decides what to do (readiness fails)
            log.exception("API server stopped unexpectedly")

    @property
    def running(self) -> bool:
        return self._server is not None and bool(self._server.ready)

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (up to shutdown_timeout) and free the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.stop()
        if thread is not None:
            thread.join(timeout if timeout is not None else self.shutdown_timeout + 5)
        self._server = None
        self._thread = None
        log.info("API server stopped")

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
