"""Failures of shard SQL as sanitized classes: what status conditions, events and logs may carry.

A `SqlFailure` names the operation and a short error class (`"create failed: timeout"`); it never
holds driver text, SQL, role passwords or the admin credentials. Driver errors are classified by
SQLSTATE through psycopg's per-code exception classes. libpq does not expose the SQLSTATE of a
failed *connection attempt*, so those (psycopg says "connection failed: ...") are classified by the
libpq/server message instead, in English as the server reports it.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerrors

# The error classes, each declared with whether retrying soon may help (True: a transient fault of the
# shard or the network; False: needs a change of configuration, credentials or data first). RETRYABLE is
# the one classification: the Database controller retries the True ones with backoff and raises the
# False ones as terminal (TerminalError, `retryable="false"`; reconciler/database/shard_sql.py), picked
# up again by the next change.
RETRYABLE: dict[str, bool] = {}


def _error_class(name: str, *, retryable: bool) -> str:
    """Declare an error class: it cannot exist without its entry in RETRYABLE."""
    RETRYABLE[name] = retryable
    return name


TIMEOUT = _error_class("timeout", retryable=True)
LOCK_TIMEOUT = _error_class("lock_timeout", retryable=True)
# The admin connection's own refusals are retryable: they are the Shard's problem (the Shard
# controller reports AdminAuthFailed/Unreachable and is asked to check at once), and the retry
# reads the admin Secret again. After a provisioner password rotation a worker may hold the old
# password for up to 10 s (AdminEndpointCache): that must cost one retry, not a terminal wait.
AUTH_FAILED = _error_class("auth_failed", retryable=True)
# The server asked for cleartext/md5: nothing was sent.
INSECURE_AUTH_REFUSED = _error_class("insecure_auth_refused", retryable=True)
CONNECTION_LOST = _error_class("connection_lost", retryable=True)
UNREACHABLE = _error_class("unreachable", retryable=True)
TLS_FAILED = _error_class("tls_failed", retryable=True)
TOO_MANY_CONNECTIONS = _error_class("too_many_connections", retryable=True)
READ_ONLY = _error_class("read_only", retryable=True)
INSUFFICIENT_PRIVILEGE = _error_class("insufficient_privilege", retryable=False)
INVALID_PROVISIONER = _error_class("invalid_provisioner", retryable=False)
NOT_FOUND = _error_class("not_found", retryable=False)
NAME_TAKEN = _error_class("name_taken", retryable=False)
OBJECT_IN_USE = _error_class("object_in_use", retryable=True)
DEPENDENT_OBJECTS = _error_class("dependent_objects", retryable=False)
CONFLICT = _error_class("conflict", retryable=True)
RESTORE_REFUSED = _error_class("restore_refused", retryable=False)
# A move step that cannot go on as things are (the detail says what a user must change first).
MOVE_REFUSED = _error_class("move_refused", retryable=False)
# Space may be freed; the Shard is not Ready (DiskFull) meanwhile.
DISK_FULL = _error_class("disk_full", retryable=True)
# The Shard controller found the shard not answering: its sessions were cut and no new one is opened.
SHARD_NOT_ANSWERING = _error_class("shard_not_answering", retryable=True)
# An unknown cause may well be transient: never give up on it silently.
OTHER = _error_class("other", retryable=True)

AUTH_SQLSTATES = frozenset({"28P01", "28000"})


class SqlFailure(Exception):
    """One failed shard operation, safe to show in a condition message, an event or a log line.

    `operation` is the operation's name ("create", "set limit", "rotate", "disable", "enable",
    "drop", "check", "inspect", "restore"), `error_class` one of the tokens above, `retryable` whether a quick
    retry may help, `sqlstate` the server's code when there was one, and `detail` an optional
    explanation written by this package (never driver text).
    """

    def __init__(
        self,
        operation: str,
        error_class: str,
        retryable: bool | None = None,
        *,
        sqlstate: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.operation = operation
        self.error_class = error_class
        self.retryable = RETRYABLE.get(error_class, True) if retryable is None else retryable
        self.sqlstate = sqlstate
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.operation} failed: {self.error_class}"
        return f"{text} ({self.detail})" if self.detail else text

    def __repr__(self) -> str:
        return f"SqlFailure({self.operation!r}, {self.error_class!r}, retryable={self.retryable})"

    def __reduce__(self) -> tuple[object, ...]:
        return (
            SqlFailure,
            (self.operation, self.error_class, self.retryable),
            {"sqlstate": self.sqlstate, "detail": self.detail},
        )

    def for_operation(self, operation: str) -> SqlFailure:
        """The same failure, reported as part of another (outer) operation."""
        if operation == self.operation:
            return self
        return SqlFailure(operation, self.error_class, self.retryable, sqlstate=self.sqlstate, detail=self.detail)


# Driver exceptions by SQLSTATE class, most specific first (isinstance order matters).
_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (pgerrors.ConnectionTimeout, TIMEOUT),  # psycopg's own: connect_timeout expired
    (pgerrors.QueryCanceled, TIMEOUT),  # 57014 statement_timeout (or a cancel)
    (pgerrors.LockNotAvailable, LOCK_TIMEOUT),  # 55P03 lock_timeout
    (pgerrors.InvalidPassword, AUTH_FAILED),  # 28P01
    (pgerrors.InvalidAuthorizationSpecification, AUTH_FAILED),  # 28000
    (pgerrors.InsufficientPrivilege, INSUFFICIENT_PRIVILEGE),  # 42501
    (pgerrors.AdminShutdown, CONNECTION_LOST),  # 57P01 terminated / server shutting down
    (pgerrors.CrashShutdown, CONNECTION_LOST),  # 57P02
    (pgerrors.IdleSessionTimeout, CONNECTION_LOST),  # 57P05
    (pgerrors.ConnectionException, CONNECTION_LOST),  # class 08
    (pgerrors.CannotConnectNow, UNREACHABLE),  # 57P03 starting up / in recovery
    (pgerrors.TooManyConnections, TOO_MANY_CONNECTIONS),  # 53300
    (pgerrors.ReadOnlySqlTransaction, READ_ONLY),  # 25006 a standby (failover in progress)
    (pgerrors.DiskFull, DISK_FULL),  # 53100 could not extend a file: no space left
    (pgerrors.ObjectInUse, OBJECT_IN_USE),  # 55006 database is being accessed by other users
    (pgerrors.DependentObjectsStillExist, DEPENDENT_OBJECTS),  # 2BP01
    (pgerrors.UndefinedObject, NOT_FOUND),  # 42704 role does not exist
    (pgerrors.InvalidCatalogName, NOT_FOUND),  # 3D000 database does not exist
    (pgerrors.DuplicateObject, CONFLICT),  # 42710 created concurrently; a re-run converges
    (pgerrors.DuplicateDatabase, CONFLICT),  # 42P04
    (pgerrors.DeadlockDetected, CONFLICT),  # 40P01
    (pgerrors.SerializationFailure, CONFLICT),  # 40001
)

# A failed connection attempt carries no SQLSTATE: match the libpq / server message (lowercased).
# Order matters: the first match wins.
_CONNECT_MESSAGES: tuple[tuple[str, str], ...] = (
    # require_auth / channel_binding refused what the server asked for (cleartext, md5, no binding).
    ("authentication method requirement", INSECURE_AUTH_REFUSED),
    ("channel binding", INSECURE_AUTH_REFUSED),
    ("password authentication failed", AUTH_FAILED),  # 28P01
    ('fatal:  role "', AUTH_FAILED),  # 28000 role ... does not exist (trust/peer methods)
    ("authentication failed", AUTH_FAILED),  # 28000/28P01: scram, md5, ident, peer, cert, ...
    ("no pg_hba.conf entry", AUTH_FAILED),  # 28000
    ("pg_hba.conf rejects connection", AUTH_FAILED),  # 28000
    ("is not permitted to log in", AUTH_FAILED),  # 28000 NOLOGIN
    ("no password supplied", AUTH_FAILED),  # libpq: empty password
    ("too many connections", TOO_MANY_CONNECTIONS),  # 53300
    ("connection slots are reserved", TOO_MANY_CONNECTIONS),  # 53300
    ("permission denied", INSUFFICIENT_PRIVILEGE),  # 42501 no CONNECT on the database
    ("does not exist", NOT_FOUND),  # 3D000 database (roles report an auth failure)
    ("the database system is", UNREACHABLE),  # 57P03 starting up, shutting down, in recovery
    ("not yet accepting connections", UNREACHABLE),  # 57P03
    ("timeout expired", TIMEOUT),
    ("timed out", TIMEOUT),
    ("ssl", TLS_FAILED),
    ("certificate", TLS_FAILED),
)

_CONNECT_PREFIXES = ("connection failed:", "connection is bad:")
# psycopg resolves host names itself; a name that does not resolve never reaches libpq.
_RESOLVE_PREFIX = "failed to resolve host"


def classify(exc: BaseException, operation: str) -> SqlFailure:
    """Turn any exception raised by shard SQL into a sanitized `SqlFailure` of `operation`."""
    if isinstance(exc, SqlFailure):
        return exc.for_operation(operation)
    sqlstate = getattr(exc, "sqlstate", None)
    for error_type, error_class in _BY_CLASS:
        if isinstance(exc, error_type):
            return SqlFailure(operation, error_class, sqlstate=sqlstate)
    if sqlstate and sqlstate[:2] == "08":
        return SqlFailure(operation, CONNECTION_LOST, sqlstate=sqlstate)
    if isinstance(exc, psycopg.OperationalError) and not sqlstate:
        error_class = _classify_connection_message(str(exc))
        return SqlFailure(operation, error_class, detail=_connect_detail(error_class, str(exc)))
    if isinstance(exc, psycopg.InterfaceError):
        return SqlFailure(operation, CONNECTION_LOST)  # e.g. "the connection is closed"
    return SqlFailure(operation, OTHER, sqlstate=sqlstate)


def _classify_connection_message(message: str) -> str:
    text = message.lower()
    if text.startswith(_RESOLVE_PREFIX):
        return UNREACHABLE
    if not text.startswith(_CONNECT_PREFIXES):
        # An established session that broke: "server closed the connection unexpectedly",
        # "consuming input failed", "the connection is lost", a socket cut at our deadline.
        return CONNECTION_LOST
    for needle, error_class in _CONNECT_MESSAGES:
        if needle in text:
            return error_class
    return UNREACHABLE  # refused, DNS, no route, closed during the handshake, ...


def _connect_detail(error_class: str, message: str) -> str | None:
    """Our own explanation of a refused connection where the class alone would puzzle an operator."""
    if error_class == INSECURE_AUTH_REFUSED and "channel binding check failed" in message.lower():
        return (
            "the server refused the login's channel binding: something between the provider and the shard "
            "terminates TLS; no password was sent"
        )
    if error_class == INSECURE_AUTH_REFUSED:
        return "the server did not offer SCRAM authentication (with channel binding under TLS); no password was sent"
    if error_class == TLS_FAILED and "sslrootcert=system" in message.lower():
        return "verify-ca needs the install's shardTLS.caBundle; the system trust store works with verify-full only"
    return None


def is_auth_failure(exc: BaseException) -> bool:
    """True when the shard rejected the admin credentials (SQLSTATE 28P01 / 28000).

    Accepts a `SqlFailure` or a raw psycopg error (e.g. from `connect_admin`).
    """
    if isinstance(exc, SqlFailure):
        return exc.error_class in (AUTH_FAILED, INSECURE_AUTH_REFUSED)
    if getattr(exc, "sqlstate", None) in AUTH_SQLSTATES:
        return True
    return isinstance(exc, psycopg.Error) and classify(exc, "check").error_class in (AUTH_FAILED, INSECURE_AUTH_REFUSED)
