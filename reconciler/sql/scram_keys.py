"""SCRAM-SHA-256 keys of a login, so libpq skips the password's PBKDF2 on every new session.

A SCRAM login costs the client one PBKDF2 of the password (4096 HMAC rounds at PostgreSQL's
default `scram_iterations`): about half of the manager's CPU per Shard check, which opens a fresh
admin session every 60 s per shard. libpq 18 accepts the result instead, as the conninfo keywords
`scram_client_key` and `scram_server_key` (base64 ClientKey and ServerKey; fe-auth-scram.c then uses
them as they are, ignoring the server's salt and iteration count, and needs no password). Both keys
are needed: without the ServerKey libpq cannot check the server's signature. Channel binding and
`require_auth` work as with a password.

The keys depend on the password, the role's salt and the iteration count. The salt and count are in
the server's first SCRAM message, which libpq does not expose: `read_salt` performs just the first
steps of a login (TLS as the sslmode asks, StartupMessage, SASLInitialResponse) and hangs up before
answering, as pg_isready hangs up before authenticating (PostgreSQL ends such a backend without
logging anything). A tenant's keys need no exchange: tenant.py chose the salt (`remember_login`).

Keys are password-equivalent: kept in memory only, never logged (repr=False), and a key that stops
working (a rotated password, a new salt) is dropped by the caller, which then logs in with the
password as before (reconciler.sql.session). Only printable ASCII passwords are derived here (SASLprep
leaves them unchanged, so the keys are what libpq would compute); any other password logs in plainly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import ssl
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import psycopg

from domain.constants import SslMode

# libpq 18 added scram_client_key / scram_server_key; with an older libpq nothing here is used.
SUPPORTED = psycopg.pq.version() >= 180000
MECHANISM = "SCRAM-SHA-256"
SALT_BYTES = 16
DEFAULT_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
# A server asking for more rounds than this gets a plain login: no unbounded work for the manager.
MAX_ITERATIONS = 1_000_000
_PROTOCOL_3_0 = 196608
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_AUTH_SASL = 10
_AUTH_SASL_CONTINUE = 11
_MAX_MESSAGE = 64 * 1024  # an authentication message or an error is far smaller


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def derivable(password: str) -> bool:
    """Printable ASCII: SASLprep leaves it unchanged, so keys derived here match libpq's."""
    return bool(password) and all(" " <= ch <= "~" for ch in password)


@dataclass(frozen=True)
class ScramKeys:
    """ClientKey and ServerKey of one password under one salt and iteration count (RFC 5802)."""

    salt: bytes = field(repr=False)
    iterations: int
    client_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def derive(cls, password: str, salt: bytes, iterations: int = DEFAULT_ITERATIONS) -> ScramKeys:
        salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        return cls(salt, iterations, client_key, server_key)

    @classmethod
    def new(cls, password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramKeys:
        """Keys under a fresh random salt (what a new role verifier is built from)."""
        return cls.derive(password, os.urandom(SALT_BYTES), iterations)

    def verifier(self) -> str:
        """The verifier PostgreSQL stores: `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`."""
        stored_key = hashlib.sha256(self.client_key).digest()
        return f"{MECHANISM}${self.iterations}:{_b64(self.salt)}${_b64(stored_key)}:{_b64(self.server_key)}"

    def conninfo(self) -> dict[str, str]:
        """libpq's parameters for a login with these keys instead of the password's PBKDF2."""
        return {"scram_client_key": _b64(self.client_key), "scram_server_key": _b64(self.server_key)}


def fingerprint(*fields: object) -> str:
    """A cache key over the fields of a login (the password among them), not reversible."""
    return hashlib.sha256("\0".join(str(value) for value in fields).encode("utf-8")).hexdigest()


class KeyCache:
    """Keys by login fingerprint, thread-safe: at most `capacity` (the oldest go first), and none
    unused for `max_idle` seconds (a rotated or deleted password's keys do not stay in memory).

    `failed` remembers a login whose salt could not be read, so it is not asked again for
    `retry_after` seconds (a pooler that speaks no SCRAM, a server that asks for too many rounds).
    """

    def __init__(self, capacity: int = 4096, retry_after: float = 300.0, max_idle: float = 600.0) -> None:
        self.capacity = capacity
        self.retry_after = retry_after
        self.max_idle = max_idle
        self._keys: OrderedDict[str, tuple[ScramKeys, float]] = OrderedDict()  # by last use, oldest first
        self._failed: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float | None = None) -> ScramKeys | None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            entry = self._keys.get(key)
            if entry is None:
                return None
            self._keys[key] = (entry[0], now)
            self._keys.move_to_end(key)
            return entry[0]

    def _expire(self, now: float) -> None:
        while self._keys:
            key, (_, used) = next(iter(self._keys.items()))
            if now - used < self.max_idle:
                return
            del self._keys[key]

    def wants(self, key: str, now: float | None = None) -> bool:
        """Whether the salt of this login is worth reading now (no keys, no recent failure)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if key in self._keys:
                return False
            failed_at = self._failed.get(key)
            return failed_at is None or now - failed_at >= self.retry_after

    def put(self, key: str, keys: ScramKeys, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._failed.pop(key, None)
            self._keys[key] = (keys, now)
            self._keys.move_to_end(key)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)

    def failed(self, key: str, now: float | None = None) -> None:
        with self._lock:
            self._failed[key] = time.monotonic() if now is None else now
            self._failed.move_to_end(key)
            while len(self._failed) > self.capacity:
                self._failed.popitem(last=False)

    def drop(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


# -- the first steps of a login: the role's salt and iteration count ------------------------------


class SaltUnavailable(Exception):
    """The server's salt could not be read (why, without secrets); the caller logs in plainly."""


@dataclass(frozen=True)
class SaltSource:
    """Where a login goes, as libpq would reach it (the password is not needed to read the salt)."""

    host: str
    port: int
    user: str
    dbname: str
    sslmode: str
    sslrootcert: str | None = None
    application_name: str = ""


def _tls_context(source: SaltSource) -> ssl.SSLContext:
    """The server verification libpq applies for the sslmode (and sslrootcert)."""
    mode = SslMode(source.sslmode)
    verify = mode in (SslMode.VERIFY_CA, SslMode.VERIFY_FULL) or (
        mode == SslMode.REQUIRE and source.sslrootcert is not None  # libpq: require + a root CA = verify-ca
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # libpq's ssl_min_protocol_version default
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if source.sslrootcert in (None, "system"):
        context.load_default_certs()
    else:
        context.load_verify_locations(cafile=source.sslrootcert)
    context.check_hostname = mode == SslMode.VERIFY_FULL
    context.verify_mode = ssl.CERT_REQUIRED
    return context


class _Wire:
    """Length-prefixed protocol messages over a socket with one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline

    def arm(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise SaltUnavailable("timed out")
        self.sock.settimeout(remaining)

    def send(self, data: bytes) -> None:
        self.arm()
        self.sock.sendall(data)

    def exact(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            self.arm()
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise SaltUnavailable("the server closed the connection")
            chunks += chunk
        return bytes(chunks)

    def message(self) -> tuple[bytes, bytes]:
        kind = self.exact(1)
        (length,) = struct.unpack("!i", self.exact(4))
        if not 4 <= length <= _MAX_MESSAGE:
            raise SaltUnavailable("malformed message")
        return kind, self.exact(length - 4)


def _startup(source: SaltSource) -> bytes:
    params = [("user", source.user), ("database", source.dbname)]
    if source.application_name:
        params.append(("application_name", source.application_name))
    body = struct.pack("!i", _PROTOCOL_3_0) + b"".join(
        key.encode() + b"\0" + value.encode("utf-8") + b"\0" for key, value in params
    )
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def _initial_response(nonce: str) -> bytes:
    # gs2 header "n,,": no channel binding (the server accepts it whatever it offers; nothing here
    # authenticates, the real login binds). The user name is empty: the server takes the startup's.
    first = f"n,,n=,r={nonce}".encode("ascii")
    body = MECHANISM.encode() + b"\0" + struct.pack("!i", len(first)) + first
    return b"p" + struct.pack("!i", len(body) + 4) + body


def _server_first(payload: bytes, nonce: str) -> tuple[bytes, int]:
    try:
        attributes = dict(part.split("=", 1) for part in payload.decode("ascii").split(","))
        salt, iterations = base64.b64decode(attributes["s"], validate=True), int(attributes["i"])
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise SaltUnavailable("malformed SCRAM message") from exc
    if not attributes.get("r", "").startswith(nonce):
        raise SaltUnavailable("SCRAM nonce mismatch")
    if not salt or not 1 <= iterations <= MAX_ITERATIONS:
        raise SaltUnavailable("unusable salt or iteration count")
    return salt, iterations


def _exchange(wire: _Wire, source: SaltSource) -> tuple[bytes, int]:
    wire.send(_startup(source))
    nonce = _b64(os.urandom(18))
    while True:
        kind, payload = wire.message()
        if kind == b"N":  # a notice: skip
            continue
        if kind == b"E":
            raise SaltUnavailable("the server refused the connection")
        if kind != b"R" or len(payload) < 4:
            raise SaltUnavailable("unexpected message")
        (code,) = struct.unpack("!i", payload[:4])
        if code == _AUTH_SASL:
            mechanisms = payload[4:].split(b"\0")
            if MECHANISM.encode() not in mechanisms:
                raise SaltUnavailable("the server offers no SCRAM-SHA-256")
            wire.send(_initial_response(nonce))
        elif code == _AUTH_SASL_CONTINUE:
            return _server_first(payload[4:], nonce)
        else:
            raise SaltUnavailable("the server asks for no SCRAM")  # trust, cleartext, md5, ...


def _negotiate_tls(sock: socket.socket, wire: _Wire, source: SaltSource) -> socket.socket:
    """Send SSLRequest and wrap the socket as the sslmode asks; the socket to speak on."""
    mode = SslMode(source.sslmode)
    if mode in (SslMode.DISABLE, SslMode.ALLOW):  # allow: libpq tries without TLS first
        return sock
    wire.send(_SSL_REQUEST)
    answer = wire.exact(1)
    if answer == b"N" and mode == SslMode.PREFER:
        return sock
    if answer != b"S":
        raise SaltUnavailable("the server does not offer TLS")
    wire.arm()
    # The handshake runs here, within the deadline; SNI goes only with a host name, as from libpq.
    return _tls_context(source).wrap_socket(sock, server_hostname=source.host)


def read_salt(source: SaltSource, timeout: float) -> tuple[bytes, int]:
    """The salt and iteration count the server uses for `source.user` (SaltUnavailable if not).

    Sends no secret: a StartupMessage and a client-first message with a fresh nonce, then hangs up
    (after a TLS close_notify, so the server reads a clean end of file and logs nothing).
    """
    if source.host.startswith("/") or source.host.startswith("@"):
        raise SaltUnavailable("Unix-domain sockets are not used for admin logins")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((source.host, int(source.port)), timeout=timeout)
    except OSError as exc:
        raise SaltUnavailable("could not connect") from exc
    stream = sock
    try:
        wire = _Wire(sock, deadline)
        stream = _negotiate_tls(sock, wire, source)
        wire.sock = stream
        return _exchange(wire, source)
    except (OSError, ValueError) as exc:  # ssl.SSLError and socket.timeout are OSErrors
        raise SaltUnavailable(type(exc).__name__) from exc
    finally:
        _hang_up(stream)


def _hang_up(stream: socket.socket) -> None:
    if isinstance(stream, ssl.SSLSocket):
        try:
            stream.settimeout(1.0)
            stream = stream.unwrap()  # close_notify: the server reads EOF, not "unexpected eof"
        except (OSError, ValueError):
            pass
    try:
        stream.close()
    except OSError:
        pass


def learn(cache: KeyCache, key: str, source: SaltSource, password: str, timeout: float) -> ScramKeys | None:
    """Read the salt of `source` and cache the keys of `password` under `key`; None if that failed
    (remembered, so the next try waits `cache.retry_after`). Never raises."""
    try:
        salt, iterations = read_salt(source, timeout)
    except SaltUnavailable:
        cache.failed(key)
        return None
    keys = ScramKeys.derive(password, salt, iterations)
    cache.put(key, keys)
    return keys
