"""A fresh login with a tenant's own credentials: the proof that a new database is usable.

`log_in` opens a NEW session as the tenant (never a pooled one: a session opened earlier keeps
answering while the postmaster accepts nobody), checks whom it logged in as, and closes it. The
password goes only to a server that proves SCRAM (`require_auth`), as with the admin sessions; it
is never logged. Failures leave as a sanitized `SqlFailure` of operation "login".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import psycopg

from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.session import REQUIRE_AUTH, keepalive_options, release_exception, run_operation

OPERATION = "login"


@dataclass(frozen=True)
class TenantLogin:
    """Where and as whom a consumer of the database logs in."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    dbname: str = ""
    sslmode: str = "require"
    sslrootcert: str | None = None  # a CA file or "system" for verify-ca / verify-full


def log_in(login: TenantLogin, timeout: float, application_name: str) -> None:
    """Log in as the tenant on a new session within `timeout` seconds; SqlFailure("login", ...) if not."""
    tls = {"sslrootcert": login.sslrootcert} if login.sslrootcert is not None else {}
    try:
        conn = psycopg.connect(
            host=login.host,
            port=int(login.port),
            user=login.user,
            password=login.password,
            dbname=login.dbname or login.user,
            sslmode=login.sslmode,
            require_auth=REQUIRE_AUTH,
            application_name=application_name,
            connect_timeout=max(2, math.ceil(timeout)),
            autocommit=True,
            **tls,
            **keepalive_options(),
        )
    except psycopg.Error as exc:  # classified, never re-raised with driver text
        release_exception(exc)
        failure = classify(exc, OPERATION)
    else:
        with conn:
            who = run_operation(conn, OPERATION, _current_user, timeout=timeout)
        if who == login.user:
            return
        failure = SqlFailure(OPERATION, errors.OTHER, detail="the login ended up as another role")
    raise failure


def _current_user(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT current_user").fetchone()
    return str(row[0]) if row else ""
