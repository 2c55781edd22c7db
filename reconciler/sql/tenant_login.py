"""A fresh login with a tenant's own credentials: the proof that a new database is usable.

`log_in` opens a NEW session as the tenant (never a pooled one: a session opened earlier keeps
answering while the postmaster accepts nobody), checks whom it logged in as, and closes it. The
password goes only to a server that proves SCRAM (`require_auth`), as with the admin sessions; it
is never logged. Failures leave as a sanitized `SqlFailure` of operation "login".

In an sslmode that always uses TLS the login is bound to the TLS channel (`channel_binding=require`):
a relay that terminates TLS cannot use it (the server refuses the proof, `insecure_auth_refused`,
and nothing is retried without binding). An endpoint that offers no channel binding under TLS
(pgBouncer; or a relay that hides the offer) gets the login without it, as does an sslmode that may
go without TLS: `log_in` then says the login was unbound, and the caller takes the tenant back from
the admin side and looks for what a relay could have done (`reconciler.sql.first_login`).

The role was just created with a verifier computed here (tenant.py), so its SCRAM keys are known:
`remember_login` keeps them (memory only, until the login or a bounded number of newer ones), and
`log_in` hands them to libpq instead of having it run the password's PBKDF2 again. Keys the server
refuses (a verifier set elsewhere, a pooler with a salt of its own) cost one more login with the
password, which decides as before.
"""

from __future__ import annotations

import psycopg

from domain.constants import SslMode
from domain.naming import alternate_name
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure, classify
from reconciler.sql.scram_keys import SUPPORTED, KeyCache, ScramKeys, fingerprint
from reconciler.sql.session import AdminEndpoint, connect_params, connect_with_keys, release_exception, run_operation

OPERATION = "login"
# Keys of the tenant passwords whose verifiers were computed lately, by (role, password).
_TENANT_KEYS = KeyCache(capacity=1024)


def remember_login(user: str, password: str, keys: ScramKeys) -> None:
    """Keep the keys of the verifier just computed for `user`'s `password` for its first login."""
    if SUPPORTED:
        _TENANT_KEYS.put(fingerprint(user, password), keys)


class TenantLogin(AdminEndpoint):
    """Where and as whom a consumer of the database logs in: the fields (and checks) of an admin
    endpoint, with the tenant's user, password and database."""


def log_in(login: TenantLogin, timeout: float, application_name: str) -> bool:
    """Log in as the tenant on a new session within `timeout` seconds; SqlFailure("login", ...) if not.

    Returns whether the login was bound to the TLS channel (see the module docstring): when it was
    not, the caller must take the tenant back (`reconciler.sql.first_login`).
    """
    bound = SslMode(login.sslmode).always_tls
    try:
        conn = _connect(login, timeout, application_name, bound)
    except _BindingNotOffered:
        bound = False  # pgBouncer, or a relay that hides the offer: unbound, and so checked afterwards
        conn = _connect(login, timeout, application_name, bound)
    with conn:
        who = run_operation(conn, OPERATION, _users, timeout=timeout)
    if who != (login.user, _acting_role(login)):
        raise SqlFailure(OPERATION, errors.OTHER, detail="the login ended up as another role")
    return bound


def _acting_role(login: TenantLogin) -> str:
    """The role a tenant's session acts as: its login role, except the tenant's alternate login role,
    whose sessions act as the tenant role (named like the tenant's database) by its role setting."""
    return login.dbname if login.user == alternate_name(login.dbname) else login.user


class _BindingNotOffered(Exception):
    """The endpoint offered no SCRAM with channel binding under TLS; nothing was sent."""


# libpq's words when channel_binding=require meets a server that does not offer SCRAM-SHA-256-PLUS.
_NOT_OFFERED = "did not offer an authentication method that supports channel binding"


def _connect(login: TenantLogin, timeout: float, application_name: str, bound: bool) -> psycopg.Connection:
    key = fingerprint(login.user, login.password)
    keys = _TENANT_KEYS.get(key) if SUPPORTED else None
    params = {**connect_params(login, application_name, timeout), "channel_binding": "require" if bound else "prefer"}
    try:
        conn = connect_with_keys(params, keys, lambda: _TENANT_KEYS.drop(key))
    except psycopg.Error as exc:  # classified, never re-raised with driver text
        release_exception(exc)
        if bound and _NOT_OFFERED in str(exc):
            raise _BindingNotOffered() from None
        raise classify(exc, OPERATION) from None
    _TENANT_KEYS.drop(key)  # used: a later login of this role goes with the password
    return conn


def _users(conn: psycopg.Connection) -> tuple[str, str]:
    """Who logged in, and the role the session acts as."""
    row = conn.execute("SELECT session_user, current_user").fetchone()
    return (str(row[0]), str(row[1])) if row else ("", "")
