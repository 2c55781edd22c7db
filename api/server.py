"""The API's front door: TLS and strict HTTP/1.1 on an asyncio loop, the WSGI app on a bounded pool.

    server = ApiServer(app, "0.0.0.0", 8443, "/etc/dbprovider/tls/tls.crt", "/etc/dbprovider/tls/tls.key")
    server.start()     # binds (port 0 picks a free port: see server.port) and serves in a thread
    ...
    server.stop()      # stops accepting, finishes in-flight requests, frees the port

Why not a thread per connection (cheroot, as before): a client that is slow or silent holds what it
occupies. Here one event loop owns every socket, and a connection costs its TLS state and the bytes it
sent (api/channel.py: TLS through memory BIOs, about 30 KiB idle; docs/api.md) until it has sent a
whole, well-framed request; only then is the app called, on `threads` workers. So:

- accepting never waits: the TLS handshake runs on the loop, after admission;
- each connection has one deadline for the handshake plus its request headers (`header_timeout`),
  one for its body (`body_timeout`), one for sending the answer, and an idle keep-alive connection is
  closed after `idle_timeout`;
- open connections are bounded overall and, until one of their requests authenticates, per client
  address; a consumer's requests in the app are bounded per consumer, and app calls take turns by
  consumer or address (api/admission.py). A full server makes room by closing the connection that
  waited longest without a request in the app; over the per-address bound a connection waits its turn;
- every app call has a deadline (`request_timeout`): past it the client gets 503 with Retry-After;
- the probe paths (/healthz, /readyz) run on threads of their own, never behind app requests;
- framing is strict (api/http1.py): ambiguous requests get 400 and the connection is closed, and so
  does a connection whose request body the app left unread;
- every refusal, deadline drop and framing error is counted by reason and logged (api/refusals.py);
- TLS 1.2 or 1.3, and on 1.2 only ECDHE with AEAD ciphers.

The certificate and key are files (the tls.secretName Secret mounted into the pod). They are re-read
when their modification time changes (checked at most every `reload_interval` seconds), so a renewed
certificate is served without a restart. docs/api.md says how this server was chosen.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry

from api.admission import AUTHENTICATED_HOOK, Connections, ConsumerRequests, Lanes, Slot, State
from api.channel import Channel
from api.errors import FALCON_ERRORS, INTERNAL_ERROR_BODY, ApiError, Unavailable
from api.http1 import DEFAULT_MAX_CHUNKS, BadRequest, RequestHead, RequestParser
from api.refusals import FrontDoorEvents
from domain.config import ApiConfig
from domain.settings import SETTINGS

log = logging.getLogger(__name__)

DEFAULT_THREADS = 16
# The front door's guard on the wire: the app answers 413 from 16 KiB of body on (with metrics); this
# leaves room for a chunked body's size lines, and bounds what a connection in the middle of a body holds.
DEFAULT_MAX_BODY_BYTES = 24 * 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_SHUTDOWN_TIMEOUT = 10.0
# The probes run on threads of their own, and answer 503 within this (the kubelet waits 3 s).
PROBE_THREADS, PROBE_TIMEOUT = 2, 2.0
RETRY_AFTER_SECONDS = 1
_HELD_BY = "dbprovider.consumer_held"  # environ: the consumer whose request slot this request holds
# TLS 1.2 suites: forward secrecy and AEAD only (TLS 1.3 suites are all AEAD).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# After a refused request: drop the client's further input for up to 2 s, until it pauses for 0.2 s or
# has sent 64 KiB more (the rest of an oversized request sent at once). A client still sending then is
# held (`_hold`), reading nothing, for the header deadline: each connection it opens costs the server a TLS
# handshake, so one that ends in a refusal must not be cheaper to repeat than an idle one.
LINGER_SECONDS, LINGER_QUIET, LINGER_BYTES = 2.0, 0.2, 64 * 1024
# The `error` code of the front door's own answers: Falcon's where Falcon answers that status too (400, 413,
# 431), so a client reads one code whichever of the two refused.
_ERROR_CODES = {status: code for status, (code, _message) in FALCON_ERRORS.items()} | {
    500: ApiError.code,
    501: "not_implemented",
    503: Unavailable.code,
    505: "http_version_not_supported",
}
_STATUS_RE = re.compile(r"[1-5][0-9]{2} [\t -~]*")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
_NO_BODY_STATUSES = frozenset({204, 304})


# Deadlines and connection bounds: the install config's `api` defaults (one place: domain/config.py).
_API_DEFAULTS = ApiConfig()


@dataclass(frozen=True)
class FrontDoorOptions:
    """The front door's bounds and deadlines (seconds), one value instead of a dozen arguments.

    The deadlines and connection bounds default to the install config's `api` block (a manager reads
    them from it: `from_config`); the pool size, byte bounds and the rest are this module's.
    """

    threads: int = DEFAULT_THREADS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = _API_DEFAULTS.header_timeout.total_seconds()
    body_timeout: float = _API_DEFAULTS.body_timeout.total_seconds()
    idle_timeout: float = _API_DEFAULTS.idle_timeout.total_seconds()
    max_connections: int = _API_DEFAULTS.max_connections
    max_connections_per_client: int = _API_DEFAULTS.max_connections_per_client
    request_timeout: float = _API_DEFAULTS.request_timeout.total_seconds()
    max_requests_per_consumer: int = _API_DEFAULTS.max_requests_per_consumer
    max_chunks: int = DEFAULT_MAX_CHUNKS
    probe_paths: frozenset[str] = frozenset((SETTINGS.probes.liveness, SETTINGS.probes.readiness))
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    reload_interval: float = 10.0  # seconds between looks at the certificate files' modification time

    def __post_init__(self) -> None:
        bounds = (self.threads, self.max_connections, self.max_connections_per_client, self.max_requests_per_consumer)
        if min(bounds) < 1:
            raise ValueError("threads and connection and request limits must be at least 1")

    @classmethod
    def from_config(cls, config: ApiConfig, *, threads: int = DEFAULT_THREADS) -> FrontDoorOptions:
        """The options an install config's `api` block sets (deadlines and connection bounds)."""
        return cls(
            threads=threads,
            header_timeout=config.header_timeout.total_seconds(),
            body_timeout=config.body_timeout.total_seconds(),
            idle_timeout=config.idle_timeout.total_seconds(),
            max_connections=config.max_connections,
            max_connections_per_client=config.max_connections_per_client,
            request_timeout=config.request_timeout.total_seconds(),
            max_requests_per_consumer=config.max_requests_per_consumer,
        )


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


def _error_response(status: int, reason: str, retry_after: int | None = None) -> bytes:
    """An answer of the front door itself: the API's JSON error body, and the connection closed."""
    body = json.dumps({"error": _ERROR_CODES.get(status, "bad_request"), "message": reason}).encode()
    phrase = HTTPStatus(status).phrase
    retry = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    return (
        (
            f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{retry}Connection: close\r\n"
        ).encode("ascii")
        + _date_header()
        + b"\r\n"
        + body
    )


def _internal_error() -> _Response:
    failed = _Response()
    failed.status = "500 Internal Server Error"
    failed.headers = [("Content-Type", "application/json")]
    failed.chunks = [INTERNAL_ERROR_BODY.encode()]
    return failed


def _lane(environ: dict[str, Any]) -> str:
    """Requests with the same credentials take turns in one lane, others by address (api/admission.py).

    The lane is not an authentication: an unknown token only gets a lane of its own, and a 401.
    """
    credentials = environ.get("HTTP_AUTHORIZATION")
    if credentials:
        return f"credentials:{hash(credentials):x}"  # the process' randomized hash; never logged
    return f"address:{environ['REMOTE_ADDR']}"


class _Dropped(Exception):
    """The connection is closed without an answer (a deadline); `reason` is the metric label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
        options: FrontDoorOptions = FrontDoorOptions(),
        registry: CollectorRegistry | None = None,
        tls: bool = True,
    ) -> None:
        if tls and (cert_file is None or key_file is None):
            raise ValueError("cert_file and key_file are required (tls=False only for local experiments)")
        self.app = app
        self.host = host
        self.requested_port = port
        self.cert_file = os.fspath(cert_file) if cert_file is not None else None
        self.key_file = os.fspath(key_file) if key_file is not None else None
        self.options = options
        self.tls = tls
        self.limits = Connections(options.max_connections, options.max_connections_per_client)
        self.consumer_requests = ConsumerRequests(options.max_requests_per_consumer)
        self.events = FrontDoorEvents(registry)
        self.lanes: Lanes | None = None
        self.tls_context: ReloadingTlsContext | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._probe_executor: ThreadPoolExecutor | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[None], Slot] = {}
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ApiServer:
        """Bind and serve in a background thread; raises OSError if the port cannot be bound."""
        if self._loop is not None:
            return self
        if self.tls:
            assert self.cert_file is not None and self.key_file is not None
            self.tls_context = ReloadingTlsContext(self.cert_file, self.key_file, self.options.reload_interval)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.create_server((self.host, self.requested_port), family=family, backlog=1024)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stopping = False
        self._executor = ThreadPoolExecutor(self.options.threads, thread_name_prefix="api-worker")
        self._probe_executor = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="api-probe")
        self.lanes = Lanes(self._executor, self.options.threads, max(1, self.consumer_requests.per_consumer))
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="api-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        mode = "TLS" if self.tls else "plain HTTP"
        log.info("API listening on %s:%s (%s, %d threads)", self.host, self.port, mode, self.options.threads)
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
        wait = timeout if timeout is not None else self.options.shutdown_timeout + 5
        try:
            future.result(wait)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(wait)
            for executor in (self._executor, self._probe_executor):
                if executor is not None:
                    executor.shutdown(wait=False, cancel_futures=True)
            self._loop = self._thread = self._executor = self._probe_executor = None
            log.info("API server stopped")

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task, slot in list(self._connections.items()):
            if slot.state is not State.BUSY:
                task.cancel()  # waiting for a request: nothing in flight
        busy_tasks = list(self._connections)
        if busy_tasks:
            _, pending = await asyncio.wait(busy_tasks, timeout=self.options.shutdown_timeout)
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
        """Accept, admit (or park, or make room, or refuse) and hand over: nothing here waits on a client."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                self.events.accept_failed(exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and (victim := self.limits.evict_one()) is not None:
                    self._evict(victim)  # out of descriptors: free one, as at maxConnections
                    if victim.task is not None:
                        await asyncio.wait({victim.task}, timeout=0.5)
                    await asyncio.sleep(0)  # the transport closes its socket on the next turn
                    continue
                await asyncio.sleep(0.1)  # instead of spinning
                continue
            client = str(address[0])
            slot, victim, refusal = self.limits.admit(client)
            if victim is not None:
                self._evict(victim)
            if slot is None:
                conn.close()
                self.events.connection_refused("maxConnections", client, refusal or "")
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.events.open.inc()
            task = loop.create_task(self._connection(conn, address, slot))
            slot.task = task
            self._connections[task] = slot

    def _evict(self, victim: Slot) -> None:
        self.events.connection_refused(
            "evicted", victim.client, f"closed to make room (it was {victim.state.value}; maxConnections)"
        )
        if victim.task is not None:
            victim.task.cancel()

    async def _connection(self, conn: socket.socket, address: Any, slot: Slot) -> None:
        task = asyncio.current_task()
        assert task is not None
        client = slot.client
        channel: Channel | None = None
        try:
            if slot.turn is not None and not slot.turn.done():  # parked: over its address' bound
                try:
                    async with asyncio.timeout(self.options.header_timeout):
                        await slot.turn
                except TimeoutError:
                    raise _Dropped("parkedTimeout") from None
            channel = Channel(self.tls_context.current() if self.tls_context is not None else None)
            await asyncio.get_running_loop().connect_accepted_socket(lambda: channel, conn)
            await self._serve(slot, channel, address)
        except _Dropped as dropped:
            self.events.connection_dropped(dropped.reason, client)
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError) as exc:
            # Clients that go away, plain HTTP on the TLS port: connection-level noise.
            log.debug("API connection from %s closed: %s", client, type(exc).__name__)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one connection, not the loop
            log.error("API connection failed: %s", type(exc).__name__)
        finally:
            self.limits.release(slot)
            self.events.open.dec()
            self._connections.pop(task, None)
            if channel is not None:
                channel.abort()  # a no-op after a graceful close
            else:
                conn.close()

    async def _serve(self, slot: Slot, channel: Channel, address: Any) -> None:
        """The connection's requests in turn, until EOF, an error, a deadline or `Connection: close`."""
        parser = RequestParser(self.options.max_header_bytes, self.options.max_body_bytes, self.options.max_chunks)
        try:
            async with asyncio.timeout(self.options.header_timeout):
                try:
                    await channel.handshake()
                except ssl.SSLError:  # not TLS, or no suite in common (a client that just closes is not counted)
                    raise _Dropped("tlsHandshake") from None
                head = await self._read_head(channel, parser)
        except TimeoutError:
            raise _Dropped("headerTimeout") from None
        while head is not None:
            self.limits.move(slot, State.BUSY)
            keep_alive = await self._exchange(slot, channel, parser, head, address)
            if not keep_alive or self._stopping:
                break
            self.limits.move(slot, State.IDLE)
            head = await self._next_head(channel, parser)
        channel.close()  # flushes what is still buffered; a client that does not read it is aborted
        async with asyncio.timeout(self.options.body_timeout):
            await channel.wait_closed()

    @staticmethod
    async def _read_head(channel: Channel, parser: RequestParser) -> RequestHead | BadRequest | None:
        """The next request's head (or why it is refused); None at a clean EOF before a request."""
        while True:
            try:
                head = parser.head()
            except BadRequest as refused:
                return refused
            if head is not None:
                return head
            data = await channel.receive()
            if not data:
                if not parser.buffered:
                    return None
                raise ConnectionResetError("closed in the middle of a request head")
            parser.feed(data)

    async def _next_head(self, channel: Channel, parser: RequestParser) -> RequestHead | BadRequest | None:
        """Keep-alive: wait up to idle_timeout for a first byte, then header_timeout for the rest."""
        if not parser.buffered:
            try:
                async with asyncio.timeout(self.options.idle_timeout):
                    data = await channel.receive()
            except TimeoutError:
                return None  # the normal end of a keep-alive connection
            if not data:
                return None
            parser.feed(data)
        try:
            async with asyncio.timeout(self.options.header_timeout):
                return await self._read_head(channel, parser)
        except TimeoutError:
            raise _Dropped("headerTimeout") from None

    async def _exchange(
        self, slot: Slot, channel: Channel, parser: RequestParser, head: RequestHead | BadRequest, address: Any
    ) -> bool:
        """One request and its answer; True if the connection may serve another."""
        try:
            if isinstance(head, BadRequest):
                raise head
            if head.expect_continue and (head.content_length or head.chunked) and not parser.buffered:
                channel.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                async with asyncio.timeout(self.options.body_timeout):
                    body = await self._read_body(channel, parser)
            except TimeoutError:
                raise _Dropped("bodyTimeout") from None
        except BadRequest as refused:
            self.events.request_refused(refused.code, refused.status, slot.client, refused.reason)
            await self._send(channel, _error_response(refused.status, refused.reason))
            if await self._linger(channel):
                await self._hold(slot, channel)
            return False
        environ = self._environ(head, body, address)
        if head.method in ("GET", "HEAD") and environ["PATH_INFO"] in self.options.probe_paths:
            response = await self._call_probe(slot, environ)
        else:
            response = await self._call(slot, environ)
        if isinstance(response, bytes):  # the front door's own answer (a deadline)
            await self._send(channel, response)
            return False
        keep_alive = head.keep_alive and environ["wsgi.input"].fully_read() and not self._stopping
        await self._send(channel, self._serialize(head, response, keep_alive))
        return keep_alive

    async def _call(self, slot: Slot, environ: dict[str, Any]) -> _Response | bytes:
        """The app on a worker in the connection's lane, within request_timeout (else a 503 answer)."""
        loop = asyncio.get_running_loop()
        environ[AUTHENTICATED_HOOK] = self._authentication_hook(slot, environ, loop)
        assert self.lanes is not None
        try:
            async with asyncio.timeout(self.options.request_timeout):
                return await self.lanes.run(_lane(environ), self._call_app, environ)
        except TimeoutError:
            why = f"no answer from the app within {self.options.request_timeout:g}s ({environ['REQUEST_METHOD']})"
            self.events.request_refused("requestTimeout", 503, slot.client, why)
            return _error_response(503, "the request took too long; try again", RETRY_AFTER_SECONDS)

    async def _call_probe(self, slot: Slot, environ: dict[str, Any]) -> _Response | bytes:
        """A probe on the probe threads, never queued behind app requests; 503 after PROBE_TIMEOUT."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(PROBE_TIMEOUT, self.options.request_timeout)):
                return await loop.run_in_executor(self._probe_executor, self._call_app, environ)
        except TimeoutError:
            self.events.request_refused("probeTimeout", 503, slot.client, f"{environ['PATH_INFO']} did not answer")
            return _error_response(503, "the probe did not answer in time", RETRY_AFTER_SECONDS)

    def _authentication_hook(
        self, slot: Slot, environ: dict[str, Any], loop: asyncio.AbstractEventLoop
    ) -> Callable[[str], bool]:
        """What the app calls (on its worker) once a request authenticated: False = over the consumer's bound."""

        def authenticated(consumer: str) -> bool:
            loop.call_soon_threadsafe(self.limits.authenticated, slot, consumer)
            if not self.consumer_requests.acquire(consumer):
                self.events.request_refused(
                    "consumerConcurrency",
                    429,
                    slot.client,
                    f"consumer {consumer} has {self.consumer_requests.per_consumer} requests in the app",
                )
                return False
            environ[_HELD_BY] = consumer
            return True

        return authenticated

    async def _read_body(self, channel: Channel, parser: RequestParser) -> bytes:
        while (body := parser.body()) is None:
            data = await channel.receive()
            if not data:
                raise ConnectionResetError("closed in the middle of a request body")
            parser.feed(data)
        return body

    @staticmethod
    async def _linger(channel: Channel) -> bool:
        """Read and drop what the client is still sending (briefly): closing a socket with unread
        input resets it, and a reset can destroy the answer before the client has read it.
        True if the client was still sending when the linger ended (its budget of time or bytes spent)."""
        dropped = 0
        try:
            async with asyncio.timeout(LINGER_SECONDS):
                while dropped < LINGER_BYTES:
                    try:
                        async with asyncio.timeout(LINGER_QUIET):
                            data = await channel.receive()
                    except TimeoutError:
                        return False  # it paused: it is reading its answer
                    if not data:
                        return False
                    dropped += len(data)
        except TimeoutError:
            return True
        except (ConnectionError, ssl.SSLError, OSError):
            return False
        return True

    async def _hold(self, slot: Slot, channel: Channel) -> None:
        """A client that goes on sending after its refusal: read nothing more, keep its connection (and
        its place in its address' bound) for the header deadline, then drop it. A client that reconnects
        as soon as it is refused (the chunk attack) so opens one connection per header deadline, as an
        idle one does, instead of one per refusal. A full server may close it to make room (it waits)."""
        channel.ignore_input()
        self.limits.move(slot, State.IDLE)
        try:
            async with asyncio.timeout(self.options.header_timeout):
                await channel.wait_closed()
        except TimeoutError:
            pass
        raise _Dropped("sendingAfterRefusal")

    async def _send(self, channel: Channel, data: bytes) -> None:
        channel.send(data)
        try:
            async with asyncio.timeout(self.options.body_timeout):  # a client that does not read its answer
                await channel.drain()
        except TimeoutError:
            raise _Dropped("sendTimeout") from None

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
            return _internal_error()
        finally:
            consumer = environ.pop(_HELD_BY, None)
            if consumer is not None:
                self.consumer_requests.release(consumer)
        return response

    def _serialize(self, head: RequestHead, response: _Response, keep_alive: bool) -> bytes:
        """The app's answer on the wire; an answer that cannot be sent as it is becomes a 500."""
        try:
            return self._encode(head, response, keep_alive)
        except (ValueError, TypeError, UnicodeEncodeError) as exc:
            log.error("API app returned an answer that cannot be sent (%s); answering 500", exc)
            return self._encode(head, _internal_error(), keep_alive)

    def _encode(self, head: RequestHead, response: _Response, keep_alive: bool) -> bytes:
        if not isinstance(response.status, str) or not _STATUS_RE.fullmatch(response.status):
            raise ValueError("a malformed status line")
        body = b"".join(response.chunks)
        code = int(response.status[:3])
        lines = [f"HTTP/1.1 {response.status}\r\n"]
        declared = None
        for name, value in response.headers:
            if not _HEADER_NAME_RE.fullmatch(name) or any(c in value for c in "\r\n\x00"):
                raise ValueError("a malformed header field")
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
