"""The API's front door: TLS and strict HTTP/1.1 on an asyncio loop, the WSGI app on a bounded pool.

    server = ApiServer(app, "0.0.0.0", 8443, "/etc/dbprovider/tls/tls.crt", "/etc/dbprovider/tls/tls.key")
    server.start()     # binds (port 0 picks a free port: see server.port) and serves in a thread
    ...
    server.stop()      # stops accepting, finishes in-flight requests, frees the port

Why not a thread per connection (cheroot, as before): a client that is slow or silent holds what it
occupies. Here one event loop owns every socket, and a connection costs a few KiB until it has sent
a whole, well-framed request; only then is the app called, on `threads` workers. So:

- accepting never waits: the TLS handshake runs on the loop, after admission;
- each connection has one deadline for the handshake plus its request headers (`header_timeout`),
  one for its body (`body_timeout`), one for sending the answer, and an idle keep-alive connection is
  closed after `idle_timeout`;
- open connections are bounded overall and per client address; a refused connection is closed at
  once and logged (at most every 10 s, with a count);
- framing is strict (api/http1.py): ambiguous requests get 400 and the connection is closed, and so
  does a connection whose request body the app left unread;
- TLS 1.2 or 1.3, and on 1.2 only ECDHE with AEAD ciphers.

The certificate and key are files (the tls.secretName Secret mounted into the pod). They are re-read
when their modification time changes (checked at most every `reload_interval` seconds), so a renewed
certificate is served without a restart. docs/api.md says how this server was chosen.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry, Counter, Gauge

from api.http1 import BadRequest, RequestHead, parse_chunk_size, parse_head
from domain.config import ApiConfig
from domain.settings import SETTINGS

log = logging.getLogger(__name__)

DEFAULT_THREADS = 16
# The front door's guard; the app answers 413 from 16 KiB on (with metrics and a JSON body).
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# Deadlines and connection bounds: the install config's `api` defaults (one place: domain/config.py).
_API_DEFAULTS = ApiConfig()
DEFAULT_HEADER_TIMEOUT = _API_DEFAULTS.header_timeout.total_seconds()
DEFAULT_BODY_TIMEOUT = _API_DEFAULTS.body_timeout.total_seconds()
DEFAULT_IDLE_TIMEOUT = _API_DEFAULTS.idle_timeout.total_seconds()
DEFAULT_MAX_CONNECTIONS = _API_DEFAULTS.max_connections
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = _API_DEFAULTS.max_connections_per_client
DEFAULT_SHUTDOWN_TIMEOUT = 10.0
# TLS 1.2 suites: forward secrecy and AEAD only (TLS 1.3 suites are all AEAD).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
REFUSAL_LOG_INTERVAL = 10.0
# After a refused request: drop the client's further input for up to 2 s, until it pauses for 0.2 s.
LINGER_SECONDS, LINGER_QUIET, LINGER_READS = 2.0, 0.2, 32
_ERROR_CODES = {413: "payload_too_large", 431: "headers_too_large", 500: "internal_error"}
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
_NO_BODY_STATUSES = frozenset({204, 304})


def front_door_options(config: ApiConfig) -> dict[str, Any]:
    """ApiServer keyword arguments from the install config's `api` block."""
    return {
        "header_timeout": config.header_timeout.total_seconds(),
        "body_timeout": config.body_timeout.total_seconds(),
        "idle_timeout": config.idle_timeout.total_seconds(),
        "max_connections": config.max_connections,
        "max_connections_per_client": config.max_connections_per_client,
    }


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context: TLS 1.2-1.3, AEAD suites, no compression or renegotiation, HTTP/1.1 ALPN."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert_file, key_file)
    return context


class ReloadingTlsContext:
    """The server context of the certificate files, rebuilt when their modification time changes."""

    def __init__(self, cert_file: str, key_file: str, reload_interval: float = 10.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.reload_interval = reload_interval
        self.context = server_tls_context(cert_file, key_file)  # a bad pair fails start()
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()

    def _file_stamp(self) -> tuple[float, float]:
        try:
            return (os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime)
        except OSError:
            return (0.0, 0.0)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection (called on the loop only: no lock)."""
        now = time.monotonic()
        if now - self._checked < self.reload_interval:
            return self.context
        self._checked = now
        stamp = self._file_stamp()
        if stamp != self._stamp:
            try:
                self.context = server_tls_context(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:  # half-written files: keep serving the old pair
                log.warning(
                    "TLS certificate changed but cannot be loaded yet (%s); keeping the old one", type(exc).__name__
                )
                return self.context
            self._stamp = stamp
            log.info("TLS certificate reloaded")
        return self.context


class ConnectionLimits:
    """Open connections, bounded overall and per client address (loop thread only).

    With a registry: dbprovider_api_connections_open and dbprovider_api_connections_refused_total{limit}.
    """

    def __init__(self, total: int, per_client: int, registry: CollectorRegistry | None = None) -> None:
        self.max_total = total
        self.max_per_client = per_client
        self.total = 0
        self.by_client: dict[str, int] = {}
        self._refused_since_log = 0
        self._last_log = -REFUSAL_LOG_INTERVAL
        self._open: Gauge | None = None
        self._refused: Counter | None = None
        if registry is not None:
            self._open = Gauge("dbprovider_api_connections_open", "Open API connections.", registry=registry)
            self._refused = Counter(
                "dbprovider_api_connections_refused",
                "API connections closed at once because a connection bound was reached.",
                ["limit"],
                registry=registry,
            )
            for limit in ("maxConnections", "maxConnectionsPerClient"):  # 0 from the start, so rate() sees them
                self._refused.labels(limit)

    def admit(self, client: str) -> str | None:
        """Take a slot for `client`, or say which bound refuses it."""
        if self.total >= self.max_total:
            self._count_refusal("maxConnections")
            return f"{self.total} connections open (maxConnections {self.max_total})"
        count = self.by_client.get(client, 0)
        if count >= self.max_per_client:
            self._count_refusal("maxConnectionsPerClient")
            return f"{count} connections open from this address (maxConnectionsPerClient {self.max_per_client})"
        self.total += 1
        self.by_client[client] = count + 1
        if self._open is not None:
            self._open.inc()
        return None

    def _count_refusal(self, limit: str) -> None:
        if self._refused is not None:
            self._refused.labels(limit).inc()

    def release(self, client: str) -> None:
        if self._open is not None:
            self._open.dec()
        self.total -= 1
        count = self.by_client[client] - 1
        if count:
            self.by_client[client] = count
        else:
            del self.by_client[client]

    def log_refusal(self, client: str, why: str) -> None:
        """A warning for the first refusal, then at most one every REFUSAL_LOG_INTERVAL with a count."""
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_log < REFUSAL_LOG_INTERVAL:
            return
        log.warning(
            "API connection refused from %s: %s (%d refused since the last such message)",
            client,
            why,
            self._refused_since_log,
        )
        self._refused_since_log = 0
        self._last_log = now


class _Input(io.BytesIO):
    """wsgi.input: the whole body, read before the app is called; tells whether the app read it all."""

    def fully_read(self) -> bool:
        return self.tell() >= len(self.getbuffer())


class _Response:
    __slots__ = ("status", "headers", "chunks")

    def __init__(self) -> None:
        self.status = "500 Internal Server Error"
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []


_date_cache: tuple[int, bytes] = (0, b"")


def _date_header() -> bytes:
    global _date_cache  # noqa: PLW0603 - one formatted Date per second, shared by every response
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode("ascii"))
    return _date_cache[1]


def _error_response(status: int, reason: str) -> bytes:
    body = json.dumps({"error": _ERROR_CODES.get(status, "bad_request"), "message": reason}).encode()
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n"
    ).encode("ascii") + _date_header() + b"\r\n" + body


class ApiServer:
    """The API's front door. See the module docstring."""

    def __init__(
        self,
        app: Callable[..., Any],
        host: str = "0.0.0.0",  # noqa: S104 - the Service routes to it
        port: int = SETTINGS.ports.api,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        *,
        threads: int = DEFAULT_THREADS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        reload_interval: float = 10.0,
        registry: CollectorRegistry | None = None,
        tls: bool = True,
    ) -> None:
        if tls and (cert_file is None or key_file is None):
            raise ValueError("cert_file and key_file are required (tls=False only for local experiments)")
        if threads < 1 or max_connections < 1 or max_connections_per_client < 1:
            raise ValueError("threads and connection limits must be at least 1")
        self.app = app
        self.host = host
        self.requested_port = port
        self.cert_file = os.fspath(cert_file) if cert_file is not None else None
        self.key_file = os.fspath(key_file) if key_file is not None else None
        self.threads = threads
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.idle_timeout = idle_timeout
        self.shutdown_timeout = shutdown_timeout
        self.reload_interval = reload_interval
        self.tls = tls
        self.limits = ConnectionLimits(max_connections, max_connections_per_client, registry)
        self.tls_context: ReloadingTlsContext | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[None], bool] = {}  # task -> busy with a request
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ApiServer:
        """Bind and serve in a background thread; raises OSError if the port cannot be bound."""
        if self._loop is not None:
            return self
        if self.tls:
            assert self.cert_file is not None and self.key_file is not None
            self.tls_context = ReloadingTlsContext(self.cert_file, self.key_file, self.reload_interval)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.create_server((self.host, self.requested_port), family=family, backlog=1024)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stopping = False
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="api-worker")
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="api-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        mode = "TLS" if self.tls else "plain HTTP"
        log.info("API listening on %s:%s (%s, %d threads)", self.host, self.port, mode, self.threads)
        return self

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None and self._listener is not None
        asyncio.set_event_loop(loop)
        self._accepting = loop.create_task(self._accept(self._listener))
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        except Exception:  # reported, the manager decides what to do (readiness fails)
            log.exception("API server stopped unexpectedly")
        finally:
            loop.close()

    @property
    def running(self) -> bool:
        return self._loop is not None and self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (up to shutdown_timeout) and free the port."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        wait = timeout if timeout is not None else self.shutdown_timeout + 5
        try:
            future.result(wait)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(wait)
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._loop = self._thread = self._executor = None
            log.info("API server stopped")

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()  # waiting for a request: nothing in flight
        busy_tasks = list(self._connections)
        if busy_tasks:
            _, pending = await asyncio.wait(busy_tasks, timeout=self.shutdown_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connections -------------------------------------------------------------------------------

    async def _accept(self, listener: socket.socket) -> None:
        """Accept, admit or refuse, and hand over: nothing here waits on a client."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and friends: back off briefly instead of spinning
                log.warning("API accept failed (%s)", type(exc).__name__)
                await asyncio.sleep(0.1)
                continue
            client = str(address[0])
            refusal = self.limits.admit(client)
            if refusal is not None:
                conn.close()
                self.limits.log_refusal(client, refusal)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._connection(conn, address))
            self._connections[task] = False

    async def _connection(self, conn: socket.socket, address: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        client = str(address[0])
        streams: list[asyncio.StreamWriter] = []
        try:
            await self._serve(task, conn, address, streams)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as exc:
            # Silent, slow or broken clients, plain HTTP on the TLS port: connection-level noise.
            log.debug("API connection from %s closed: %s", client, type(exc).__name__)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one connection, not the loop
            log.error("API connection failed: %s", type(exc).__name__)
        finally:
            self.limits.release(client)
            self._connections.pop(task, None)
            if streams:
                streams[0].transport.abort()  # no-op after a graceful close
            else:
                conn.close()

    async def _serve(
        self, task: asyncio.Task[None], conn: socket.socket, address: Any, streams: list[asyncio.StreamWriter]
    ) -> None:
        """The connection's requests in turn, until EOF, an error, a deadline or `Connection: close`."""
        async with asyncio.timeout(self.header_timeout):
            reader, writer = await self._open(conn)
            streams.append(writer)
            block = await self._read_head(reader)
        while block is not None:
            self._connections[task] = True
            keep_alive = await self._exchange(reader, writer, block, address)
            self._connections[task] = False
            if not keep_alive or self._stopping:
                break
            block = await self._next_head(reader)
        writer.close()  # flushes what is still buffered; a client that does not read it is aborted
        async with asyncio.timeout(self.body_timeout):
            await writer.wait_closed()

    async def _open(self, conn: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams over the accepted socket, after a TLS handshake on the loop when TLS is on."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.max_header_bytes, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        context = self.tls_context.current() if self.tls_context is not None else None
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, conn, ssl=context, ssl_handshake_timeout=self.header_timeout if context else None
        )
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _read_head(self, reader: asyncio.StreamReader, first: bytes = b"") -> bytes | BadRequest | None:
        """The header block without its final CRLFCRLF; None at a clean EOF before a request."""
        try:
            block = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return BadRequest("request header block too large", 431)
        except asyncio.IncompleteReadError as exc:
            if not first and not exc.partial:
                return None
            raise
        return first + block[:-4]

    async def _next_head(self, reader: asyncio.StreamReader) -> bytes | BadRequest | None:
        """Keep-alive: wait up to idle_timeout for a first byte, then header_timeout for the rest."""
        async with asyncio.timeout(self.idle_timeout):
            first = await reader.read(1)
        if not first:
            return None
        async with asyncio.timeout(self.header_timeout):
            return await self._read_head(reader, first)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, block: bytes | BadRequest, address: Any
    ) -> bool:
        """One request and its answer; True if the connection may serve another."""
        try:
            if isinstance(block, BadRequest):
                raise block
            head = parse_head(block)
            if head.content_length > self.max_body_bytes:
                raise BadRequest("request body too large", 413)
            if head.expect_continue and (head.content_length or head.chunked):
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            async with asyncio.timeout(self.body_timeout):
                body = await self._read_body(reader, head)
        except BadRequest as exc:
            await self._send(writer, _error_response(exc.status, exc.reason))
            log.debug("API request refused: %s", exc.reason)
            await self._linger(reader)
            return False
        environ = self._environ(head, body, address)
        loop = asyncio.get_running_loop()
        assert self._executor is not None
        response = await loop.run_in_executor(self._executor, self._call_app, environ)
        keep_alive = head.keep_alive and environ["wsgi.input"].fully_read() and not self._stopping
        await self._send(writer, self._serialize(head, response, keep_alive))
        return keep_alive

    async def _read_body(self, reader: asyncio.StreamReader, head: RequestHead) -> bytes:
        if not head.chunked:
            return await reader.readexactly(head.content_length) if head.content_length else b""
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise BadRequest("chunk size line too long") from None
            chunk = parse_chunk_size(line[:-2])
            size += chunk
            if size > self.max_body_bytes:
                raise BadRequest("request body too large", 413)
            if chunk == 0:
                break
            data = await reader.readexactly(chunk + 2)
            if data[-2:] != b"\r\n":
                raise BadRequest("chunk without its CRLF")
            parts.append(data[:-2])
        trailer_bytes = 0
        while True:  # trailer fields are read and dropped, within the header size bound
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise BadRequest("trailer too long") from None
            trailer_bytes += len(line)
            if line == b"\r\n":
                return b"".join(parts)
            if trailer_bytes > self.max_header_bytes:
                raise BadRequest("trailer too long", 431)

    @staticmethod
    async def _linger(reader: asyncio.StreamReader) -> None:
        """Read and drop what the client is still sending (briefly): closing a socket with unread
        input resets it, and a reset can destroy the answer before the client has read it."""
        try:
            async with asyncio.timeout(LINGER_SECONDS):
                for _ in range(LINGER_READS):
                    if not await asyncio.wait_for(reader.read(65536), LINGER_QUIET):
                        return
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            return

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        async with asyncio.timeout(self.body_timeout):  # a client that does not read its answer
            await writer.drain()

    # -- WSGI ----------------------------------------------------------------------------------------

    def _environ(self, head: RequestHead, body: bytes, address: Any) -> dict[str, Any]:
        path, _, query = head.target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": head.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": head.version,
            "REMOTE_ADDR": str(address[0]),
            "REMOTE_PORT": str(address[1]),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if self.tls else "http",
            "wsgi.input": _Input(body),
            "wsgi.input_terminated": True,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        if body:
            environ["CONTENT_LENGTH"] = str(len(body))  # a chunked body arrives de-chunked
        for name, value in head.headers:
            if name == "content-type":
                environ["CONTENT_TYPE"] = value
                continue
            if name in ("content-length", "transfer-encoding"):
                continue
            key = "HTTP_" + name.upper().replace("-", "_")
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ

    def _call_app(self, environ: dict[str, Any]) -> _Response:
        """On a worker: run the app to the end (API answers are small) and collect its answer."""
        response = _Response()

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            response.status, response.headers = status, headers
            return response.chunks.append

        try:
            result: Iterable[bytes] = self.app(environ, start_response)
            try:
                response.chunks.extend(piece for piece in result if piece)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception as exc:  # noqa: BLE001 - the app's handlers answer; this is a last resort
            log.error("API app failed: %s", type(exc).__name__)
            failed = _Response()
            failed.headers = [("Content-Type", "application/json")]
            failed.chunks = [b'{"error": "internal_error", "message": "internal error"}']
            return failed
        return response

    def _serialize(self, head: RequestHead, response: _Response, keep_alive: bool) -> bytes:
        body = b"".join(response.chunks)
        code = int(response.status[:3])
        lines = [f"HTTP/1.1 {response.status}\r\n"]
        declared = None
        for name, value in response.headers:
            if any(c in name or c in value for c in "\r\n"):
                log.error("API app returned a header with a line break; answering 500")
                return _error_response(500, "internal error")
            lowered = name.lower()
            if lowered == "content-length":
                declared = value
            if lowered in _HOP_BY_HOP:
                continue
            lines.append(f"{name}: {value}\r\n")
        if head.method == "HEAD":
            body = b""
            if declared is not None:
                lines.append(f"Content-Length: {declared}\r\n")
        elif code not in _NO_BODY_STATUSES and code >= 200:
            lines.append(f"Content-Length: {len(body)}\r\n")
        if not keep_alive:
            lines.append("Connection: close\r\n")
        return "".join(lines).encode("latin-1") + _date_header() + b"\r\n" + body
