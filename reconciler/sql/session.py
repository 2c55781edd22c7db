"""Admin sessions to a shard and the bound on every SQL operation.

`connect_admin` opens one autocommit session with the provider's session settings (application
name, `search_path=pg_catalog`, `statement_timeout`, `lock_timeout`). The password goes only to a
server that proves SCRAM (`require_auth=scram-sha-256`: libpq refuses a cleartext or md5 request
instead of answering it), over TLS and bound to the TLS channel (`channel_binding=require`); an
`AdminEndpoint` in a mode that may go without TLS exists only when the install allows it for that
shard (`cleartext_allowed`, reconciler.shard.admin). With libpq 18 an admin login after the first one to an
endpoint hands libpq the password's SCRAM keys instead of having it run PBKDF2 (`ADMIN_KEYS`,
reconciler.sql.scram_keys): every login is still a fresh, complete SCRAM exchange bound to TLS; keys
the server refuses are dropped and the login is made again with the password.
`AdminSession` keeps such a session for one worker and reopens it after a connection loss.
`run_operation` runs one operation: bounded by a deadline that cuts the session's socket if the
shard stops answering (a stopped or partitioned server never enforces its own statement_timeout),
and retried on a new session after a connection loss (a Patroni or coordinator failover) when an
`AdminSession` was given. Every failure leaves as a sanitized `SqlFailure`.

Fencing: an `AdminSession` built with a `fence` calls it before each attempt of an operation and
before every statement it sends (its connections' cursors check first), so a replica that lost
its Lease sends nothing more, even in the middle of an operation. Whatever the fence raises
passes through `run_operation` unchanged (it is not a SQL failure).

A shard that stops answering: every session has TCP keepalives and a tcp_user_timeout (a peer gone
from the network ends it within seconds), and its connect timeout is the shard check's (`gate`,
`connect_timeout`, kept current by `AdminSessions`). An operation that has waited `suspect_after`
seconds for an answer calls `on_slow` (the Shard controller checks the shard now); if the shard no
longer answers, `sever()` cuts its sessions from another thread and the `gate` refuses new ones
(`shard_not_answering`, not retried inside the operation), so the work ends within the check's
bounds instead of the operation's two minutes.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypedDict, TypeVar, Unpack

import psycopg

from domain.constants import SslMode
from domain.settings import SETTINGS
from reconciler.sql import errors, scram_keys
from reconciler.sql.deadlines import DEADLINES, Deadline
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.scram_keys import KeyCache, SaltSource, ScramKeys

# The bounds of SQL work (SETTINGS.sql says why each is what it is).
OPERATION_TIMEOUT = SETTINGS.sql.operation_timeout  # seconds: one whole operation, reconnects and retries included
STATEMENT_TIMEOUT = SETTINGS.sql.statement_timeout
LOCK_TIMEOUT = SETTINGS.sql.lock_timeout
CONNECT_TIMEOUT = SETTINGS.sql.connect_timeout  # seconds per connection attempt (libpq enforces at least 2)
APPLICATION_NAME = "dbprovider"
REQUIRE_AUTH = "scram-sha-256"  # libpq 16+; psycopg[binary] bundles a newer libpq
ADMIN_DATABASE = "postgres"
# Connection losses inside one operation: this many retries, each on a new session, after the
# backoff's pauses. Always within the operation's deadline.
RECONNECT_RETRIES = SETTINGS.sql.reconnect_retries
RECONNECT_BACKOFF = SETTINGS.sql.reconnect
SUSPECT_AFTER = SETTINGS.shard_checks.suspect_after
# Failures that a new session may cure (the old one is gone or the primary moved).
_RECONNECTABLE = frozenset({errors.CONNECTION_LOST, errors.UNREACHABLE, errors.READ_ONLY})
# Failures after which the session is dropped (the next operation opens a new one).
_UNUSABLE_AFTER = _RECONNECTABLE | {errors.TIMEOUT, errors.SHARD_NOT_ANSWERING}

T = TypeVar("T")
Connector = Callable[[float], psycopg.Connection]
Fence = Callable[[], None]
Gate = Callable[[], "str | None"]  # why no session may be opened now (None: it may)


def _fenced_cursor(fence: Fence) -> type[psycopg.Cursor]:
    """A cursor class that calls `fence()` before it sends anything (installed as cursor_factory)."""

    class FencedCursor(psycopg.Cursor):
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            fence()
            return super().execute(*args, **kwargs)

        def executemany(self, *args: Any, **kwargs: Any) -> None:
            fence()
            return super().executemany(*args, **kwargs)

    return FencedCursor


@dataclass(frozen=True)
class AdminEndpoint:
    """How the provider reaches a shard to run DDL (the primary Service, never pgBouncer)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    sslmode: str = SslMode.REQUIRE.value
    dbname: str = ADMIN_DATABASE
    sslrootcert: str | None = None  # a CA file, "system", or None (libpq's default)
    # An sslmode that may go without TLS (disable, allow, prefer) only when the install allows it for
    # this shard (shardTLS.cleartextShards): without TLS nothing binds the login to the server.
    cleartext_allowed: bool = False

    def __post_init__(self) -> None:
        if self.sslmode not in {mode.value for mode in SslMode}:
            raise ValueError(f"unknown sslmode {self.sslmode!r}")
        if not SslMode(self.sslmode).always_tls and not self.cleartext_allowed:
            raise ValueError(f"sslmode {self.sslmode} may go without TLS: only with cleartext_allowed")
        if not 0 < int(self.port) < 65536:
            raise ValueError("port must be between 1 and 65535")


def session_options(statement_timeout: str = STATEMENT_TIMEOUT, lock_timeout: str = LOCK_TIMEOUT) -> str:
    """The libpq `options` of an admin session."""
    for value in (statement_timeout, lock_timeout):
        if not value.replace(".", "").isalnum():
            raise ValueError("timeouts are PostgreSQL durations such as '60s' or '500ms'")
    return f"-c statement_timeout={statement_timeout} -c lock_timeout={lock_timeout} -c search_path=pg_catalog"


def keepalive_options() -> dict[str, int]:
    """libpq's TCP keepalive and user-timeout parameters of every admin session (SETTINGS.sql)."""
    sql_timings = SETTINGS.sql
    return {
        "keepalives": 1,
        "keepalives_idle": sql_timings.keepalives_idle,
        "keepalives_interval": sql_timings.keepalives_interval,
        "keepalives_count": sql_timings.keepalives_count,
        "tcp_user_timeout": sql_timings.tcp_user_timeout_ms,
    }


def connect_params(endpoint: AdminEndpoint, application_name: str, connect_timeout: float) -> dict[str, Any]:
    """The libpq parameters of a new autocommit session to `endpoint`: SCRAM only, keepalives, the
    CA for verify-ca/-full, at least libpq's 2 s to connect."""
    tls = {"sslrootcert": endpoint.sslrootcert} if endpoint.sslrootcert is not None else {}
    return {
        "host": endpoint.host,
        "port": int(endpoint.port),
        "user": endpoint.user,
        "password": endpoint.password,
        "dbname": endpoint.dbname,
        "sslmode": endpoint.sslmode,
        "require_auth": REQUIRE_AUTH,
        "application_name": application_name,
        "connect_timeout": max(2, math.ceil(connect_timeout)),
        "autocommit": True,
        **tls,
        **keepalive_options(),
    }


class SessionOptions(TypedDict, total=False):
    """The settings of an admin session that a caller may choose, by keyword; `connect_admin` holds
    their defaults, and `AdminSession.for_endpoint` passes them on."""

    application_name: str
    statement_timeout: str
    lock_timeout: str
    fence: Fence | None


def connect_admin(
    endpoint: AdminEndpoint,
    application_name: str = APPLICATION_NAME,
    connect_timeout: float = CONNECT_TIMEOUT,
    *,
    statement_timeout: str = STATEMENT_TIMEOUT,
    lock_timeout: str = LOCK_TIMEOUT,
    fence: Fence | None = None,
) -> psycopg.Connection:
    """Open one autocommit admin session. Raises psycopg errors (see `errors.classify`).

    After the first login to an endpoint its SCRAM salt is read once more (`ADMIN_KEYS`): `fence` is
    asked first, so a replica that lost its Lease in between contacts the shard no further.
    Never log a raw connection error of psycopg: its `pgconn` attribute carries the password.
    """
    # SCRAM bound to the TLS channel: a relay (even one terminating TLS) cannot use the login. In the
    # modes that may go without TLS (allowed per shard) binding is used whenever TLS is there.
    binding: dict[str, Any] = {"channel_binding": "require" if SslMode(endpoint.sslmode).always_tls else "prefer"}
    if endpoint.sslmode == SslMode.DISABLE:
        binding["channel_binding"] = "disable"
    params = {
        **connect_params(endpoint, application_name, connect_timeout),
        **binding,
        "options": session_options(statement_timeout, lock_timeout),
    }
    key = admin_keys_key(endpoint)
    if key is None:
        return connect_with_keys(params, None)
    conn = connect_with_keys(params, ADMIN_KEYS.get(key), lambda: ADMIN_KEYS.drop(key))
    if ADMIN_KEYS.wants(key):  # once per endpoint and password: the next logins skip PBKDF2
        if fence is not None:
            try:
                fence()
            except BaseException:
                conn.close()
                raise
        source = SaltSource(
            endpoint.host,
            int(endpoint.port),
            endpoint.user,
            endpoint.dbname,
            endpoint.sslmode,
            endpoint.sslrootcert,
            application_name,
        )
        scram_keys.learn(ADMIN_KEYS, key, source, endpoint.password, params["connect_timeout"])
    return conn


# The SCRAM keys of the admin logins (reconciler.sql.scram_keys), by endpoint and password.
ADMIN_KEYS = KeyCache()


def admin_keys_key(endpoint: AdminEndpoint) -> str | None:
    """The cache key of an endpoint's SCRAM keys; None when its logins derive none (libpq < 18, or a
    password SASLprep would change)."""
    if not scram_keys.SUPPORTED or not scram_keys.derivable(endpoint.password):
        return None
    return scram_keys.fingerprint(endpoint.host, endpoint.port, endpoint.user, endpoint.password)


def connect_with_keys(
    params: dict[str, Any], keys: ScramKeys | None, refused: Callable[[], None] | None = None
) -> psycopg.Connection:
    """`psycopg.connect(**params)`, first with `keys` if given (libpq skips the password's PBKDF2).

    Keys the server refuses (a password or salt changed since they were derived) are reported to
    `refused` and the login is made once more with the password, so what the caller sees (success
    or the error) is what a login with the password gives. Raises psycopg errors.
    """
    if keys is not None:
        try:
            return psycopg.connect(**{**params, **keys.conninfo()})
        except psycopg.Error as exc:
            release_exception(exc)  # close a half-open connection now (see release_exception)
            if not keys_refused(exc):
                raise
        if refused is not None:
            refused()
    try:
        return psycopg.connect(**params)
    except psycopg.Error as exc:
        release_exception(exc)
        raise


def keys_refused(exc: psycopg.Error) -> bool:
    """Whether a login with SCRAM keys failed because of the keys: the server rejected the proof
    (an auth failure), or the server's signature did not match the ServerKey."""
    return classify(exc, "login").error_class == errors.AUTH_FAILED or "server signature" in str(exc).lower()


class AdminSession:
    """One worker's admin session to one shard, reopened on demand after a connection loss.

    `connect(timeout_seconds)` opens a new autocommit session (see `for_endpoint`). The session is
    opened lazily by the first operation, so connection failures are bounded and classified like any
    other failure of that operation. Not thread-safe: one per worker.
    """

    def __init__(
        self, connect: Connector, connect_timeout: float = CONNECT_TIMEOUT, fence: Fence | None = None
    ) -> None:
        self._connect = connect
        self.connect_timeout = connect_timeout  # replaceable: AdminSessions keeps it at the shard check's
        self._conn: psycopg.Connection | None = None
        self.fence = fence
        self._cursor_factory = _fenced_cursor(fence) if fence is not None else None
        self.connects = 0  # sessions opened so far (observability and tests)
        self.gate: Gate | None = None  # asked before every attempt: may a session be used now?
        self.on_slow: Callable[[], None] | None = None  # called once per attempt after SUSPECT_AFTER s
        self.suspect_after = SUSPECT_AFTER

    @classmethod
    def for_endpoint(
        cls, endpoint: AdminEndpoint, *, connect_timeout: float = CONNECT_TIMEOUT, **options: Unpack[SessionOptions]
    ) -> AdminSession:
        """A session whose connections are `connect_admin(endpoint, **options)` (its defaults apply)."""

        def connect(timeout: float) -> psycopg.Connection:
            return connect_admin(endpoint, connect_timeout=timeout, **options)

        return cls(connect, connect_timeout, options.get("fence"))

    def connection(self, timeout: float | None = None) -> psycopg.Connection:
        """The open session, or a new one (connect timeout: the smaller of its own and `timeout`)."""
        if self._conn is not None and not self._conn.broken and not self._conn.closed:
            return self._conn
        self.discard()
        limit = self.connect_timeout if timeout is None else min(self.connect_timeout, timeout)
        self._conn = self._connect(limit)
        if self._cursor_factory is not None:
            self._conn.cursor_factory = self._cursor_factory
        self.connects += 1
        return self._conn

    def discard(self) -> None:
        """Drop the current session (after a failure that may have left it unusable)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken session must not fail
                pass

    def close(self) -> None:
        self.discard()

    def sever(self) -> None:
        """Cut the open session's socket, from any thread: a statement blocked on it returns at once
        with a lost connection (the session is replaced on the next operation)."""
        conn = self._conn
        if conn is not None:
            _sever(conn)

    def __enter__(self) -> AdminSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Admin = psycopg.Connection | AdminSession


class _Watchdog:
    """Cuts the session's socket at the deadline, so a hung server cannot block the caller; and
    calls `on_slow` (if given) once the attempt has run `suspect_after` seconds.

    Shutting the socket down makes the blocked libpq call return at once with a connection error;
    the session is unusable afterwards (an `AdminSession` replaces it on the next operation).
    Both are deadlines of the process' one deadline thread (reconciler.sql.deadlines), not a thread
    per operation; `on_slow` (not ours: it may take a lock) runs on a thread of its own when it is due.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        deadline: float,
        on_slow: Callable[[], None] | None = None,
        suspect_after: float = SUSPECT_AFTER,
    ) -> None:
        self._conns = [conn]
        self.deadline = deadline
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._on_slow = on_slow
        self._suspect_after = suspect_after
        self._pending: list[Deadline] = []

    def __enter__(self) -> _Watchdog:
        _running.watchdog = self
        self._pending.append(DEADLINES.at(self.deadline, self._fire))
        on_slow = self._on_slow
        if on_slow is not None and (suspect_at := time.monotonic() + self._suspect_after) < self.deadline:
            self._pending.append(DEADLINES.at(suspect_at, partial(self._suspect, on_slow)))
        return self

    def __exit__(self, *exc: object) -> None:
        _running.watchdog = None
        for pending in self._pending:
            DEADLINES.cancel(pending)
        with self._lock:
            self._done = True

    def also(self, conn: psycopg.Connection) -> None:
        """Cut this session too at the deadline (a second session of the same operation)."""
        with self._lock:
            self._conns.append(conn)
            fired = self.fired
        if fired:
            _sever(conn)

    def _suspect(self, on_slow: Callable[[], None]) -> None:
        with self._lock:
            if self._done:
                return
        threading.Thread(target=_call_quietly, args=(on_slow,), name="sql-slow", daemon=True).start()

    def _fire(self) -> None:
        # Under the lock: the cut wakes the caller at once, and its __exit__ then waits here until the
        # duplicated descriptors are closed too, so no socket of the operation outlives it.
        with self._lock:
            if self._done:
                return
            self.fired = True
            for conn in self._conns:
                _sever(conn)


def _call_quietly(hint: Callable[[], None]) -> None:
    try:
        hint()
    except Exception:  # noqa: BLE001 - a hint only; the deadline still holds
        pass


# The watchdog of the operation running on this thread (set while its body runs).
_running = threading.local()


# What the owner of a database may set for every session in it (ALTER DATABASE ... SET, ALTER ROLE ALL
# IN DATABASE ... SET) is applied when a session logs in. What would stop, end or redirect the
# provider's session there before it can undo it, or acts in parallel workers (which start with the
# database's settings), is overridden at login: options sent at login take precedence over both
# (tested on 15, 16 and 18 with every parameter a database owner may set). `role` would make every
# session start as (and RESET ROLE return to) the owner; a library the owner names ends the login.
_LOGIN_OVERRIDES: tuple[tuple[str, str, int], ...] = (  # (parameter, value, from major)
    ("role", "none", 0),
    ("local_preload_libraries", "", 0),
    ("default_transaction_read_only", "off", 0),
    ("default_transaction_isolation", r"read\ committed", 0),
    ("idle_in_transaction_session_timeout", "0", 0),
    ("idle_session_timeout", "0", 14),
    ("transaction_timeout", "0", 17),
    ("exit_on_error", "off", 0),
    ("client_min_messages", "warning", 0),
    ("max_parallel_workers_per_gather", "0", 0),
)
# Everything else the owner set for its database goes back to PostgreSQL's built-in default right
# after the login, in one statement (planner settings, date styles, search paths, ...).
_RESET_OWNER_SETTINGS = """
SELECT count(pg_catalog.set_config(name, boot_val, false)) FROM pg_catalog.pg_settings
 WHERE source = 'database' AND context = 'user' AND boot_val IS NOT NULL
"""


def owner_settings_overridden(server_version: int) -> str:
    """libpq `options` that override what a database's owner set for the sessions in it (see above)."""
    major = server_version // 10000
    return " ".join(f"-c {name}={value}" for name, value, since in _LOGIN_OVERRIDES if major >= since)


def connect_database(conn: psycopg.Connection, dbname: str) -> psycopg.Connection:
    """A second session like `conn` (same server, role, TLS and session settings) in database `dbname`.

    For the few statements that must run inside another database (PostgreSQL keeps most of a
    database's catalog to itself). That database's owner (a tenant) may have set parameters for every
    session in it: the ones that act at login are overridden then (`owner_settings_overridden`, and
    the client encoding), all others are set back to PostgreSQL's defaults right after, so the
    session is the provider's, as `conn` is. Inside `run_operation` it is bounded by the
    operation's deadline like `conn` (cut by the same watchdog) and fenced like it; the caller closes
    it. Raises psycopg errors (see `errors.classify`); never log them raw (their `pgconn` carries the
    password).
    """
    params: dict[str, Any] = {key: value for key, value in conn.info.get_parameters().items() if key != "dbname"}
    watchdog: _Watchdog | None = getattr(_running, "watchdog", None)
    timeout = float(params.pop("connect_timeout", CONNECT_TIMEOUT))
    if watchdog is not None:
        timeout = min(timeout, watchdog.deadline - time.monotonic())
    params.pop("client_encoding", None)
    options = " ".join(filter(None, (params.pop("options", ""), owner_settings_overridden(conn.info.server_version))))
    try:
        other = psycopg.connect(
            **params,
            password=conn.info.password,
            dbname=dbname,
            options=options,
            client_encoding="UTF8",
            connect_timeout=max(2, math.ceil(timeout)),
            autocommit=True,
        )
    except psycopg.Error as exc:
        release_exception(exc)
        raise
    other.cursor_factory = conn.cursor_factory
    if watchdog is not None:
        watchdog.also(other)
    try:
        other.execute(_RESET_OWNER_SETTINGS)
    except BaseException:
        other.close()
        raise
    return other


def _sever(conn: psycopg.Connection) -> None:
    try:
        fd = conn.pgconn.socket
    except Exception:  # noqa: BLE001 - already closed: nothing is blocked on it
        return
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)  # acts on the shared socket, not only on the duplicate
    except OSError:
        pass
    finally:
        sock.close()


def run_operation(
    admin: Admin,
    operation: str,
    body: Callable[[psycopg.Connection], T],
    *,
    timeout: float = OPERATION_TIMEOUT,
    retries: int = RECONNECT_RETRIES,
) -> T:
    """Run `body(conn)` as `operation`, bounded by `timeout` seconds; failures as `SqlFailure`.

    `body` must be idempotent: after a connection loss it runs again from the start on a new
    session (only when `admin` is an `AdminSession`; a plain connection cannot be reopened).
    """
    deadline = time.monotonic() + timeout
    session = admin if isinstance(admin, AdminSession) else None
    attempt = 0
    while True:
        outcome = _attempt(admin, session, operation, body, deadline)
        if isinstance(outcome, _Success):
            return outcome.value  # type: ignore[return-value]
        failure = outcome
        if session is not None and failure.error_class in _UNUSABLE_AFTER:
            session.discard()
        pause = RECONNECT_BACKOFF.delay(attempt)
        if (
            session is None
            or failure.error_class not in _RECONNECTABLE
            or attempt >= retries
            or time.monotonic() + pause >= deadline
        ):
            raise failure
        attempt += 1
        time.sleep(pause)


def release_exception(exc: BaseException) -> None:
    """Drop the frames a failed connect keeps alive, so its socket closes now, not at the next GC.

    After a connect timeout psycopg's exception references (through a reference cycle of
    tracebacks and frames) the half-open libpq connection; the server's backend for it would
    otherwise wait for authentication_timeout (60 s) and meanwhile block DROP DATABASE.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__context__ or current.__cause__


@dataclass(frozen=True)
class _Success:
    value: object


def _attempt(
    admin: Admin,
    session: AdminSession | None,
    operation: str,
    body: Callable[[psycopg.Connection], T],
    deadline: float,
) -> _Success | SqlFailure:
    """One try; returns the failure instead of raising, so no driver exception stays attached."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return SqlFailure(operation, errors.TIMEOUT)
    if session is not None and session.fence is not None:
        session.fence()  # not even a connection attempt from a replica that may not write
    if session is not None and session.gate is not None and (why := session.gate()) is not None:
        session.discard()
        return SqlFailure(operation, errors.SHARD_NOT_ANSWERING, detail=why)
    try:
        conn = session.connection(remaining) if session is not None else admin
    except psycopg.Error as exc:  # classified, never re-raised with driver text
        release_exception(exc)
        return classify(exc, operation)
    assert isinstance(conn, psycopg.Connection)
    on_slow = session.on_slow if session is not None else None
    suspect_after = session.suspect_after if session is not None else SUSPECT_AFTER
    watchdog = _Watchdog(conn, deadline, on_slow, suspect_after)
    try:
        with watchdog:
            return _Success(body(conn))
    except (psycopg.Error, SqlFailure) as exc:
        failure = classify(exc, operation)
    if watchdog.fired:
        return SqlFailure(operation, errors.TIMEOUT)
    if session is not None and session.gate is not None and (why := session.gate()) is not None:
        return SqlFailure(operation, errors.SHARD_NOT_ANSWERING, detail=why)  # cut by sever(): say why
    return failure
