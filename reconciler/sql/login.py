"""A fresh login with a tenant's own credentials: the proof that a new database is usable.

`log_in` opens a NEW session as the tenant (never a pooled one: a session opened earlier keeps
answering while the postmaster accepts nobody), checks whom it logged in as, and closes it. The
password goes only to a server that proves SCRAM (`require_auth`), as with the admin sessions; it
is never logged. Failures leave as a sanitized `SqlFailure` of operation "login".
"""

from __future__ import annotations

import psycopg

from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.session import AdminEndpoint, connect_params, release_exception, run_operation

OPERATION = "login"


class TenantLogin(AdminEndpoint):
    """Where and as whom a consumer of the database logs in: the fields (and checks) of an admin
    endpoint, with the tenant's user, password and database."""


def log_in(login: TenantLogin, timeout: float, application_name: str) -> None:
    """Log in as the tenant on a new session within `timeout` seconds; SqlFailure("login", ...) if not."""
    try:  # no channel_binding: a pooler (pgBouncer) in front of the server may not offer it
        conn = psycopg.connect(**connect_params(login, application_name, timeout))
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
