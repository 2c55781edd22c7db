"""After a first login that may have been relayed: take the tenant back, and look for what was done.

A login as the tenant that is not bound to the TLS channel (an endpoint without TLS, or one that
offers no channel binding, such as pgBouncer) may have passed through a relay, which then holds an
authenticated session as the tenant: it may keep it to read the consumer's data later, set a
password of its own, grant the database or future tables to another role, set parameters or create
objects. `seal_first_login` runs on the admin session right after such a login, before the database
is Ready (nobody else has its credentials yet):

1. in one transaction, `ALTER ROLE t PASSWORD '<verifier of the provider's password>'` and, as the
   tenant, the end of every session of `t`; again while a session of `t` remains (one that logged in
   with a password of the relay's before the change committed), so no session and no password of
   anybody else's is left. Every state in between leaves the provider's password valid unless a
   relay changes it again, so an interrupted seal is simply run again by the next pass. A tenant made
   again while its Secret names the alternate login role (a failover lost it) logged in as `t_alt`:
   the password goes on `t_alt`, `t` keeps no login and no password, and the sessions of both end;
2. one read of the shared catalogs for anything of the tenant the provider did not make (`findings`):
   the database is new and empty, the provider granted in it only CONNECT to its owner, and set no
   parameter, so whatever is there came through that login.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from domain.settings import SETTINGS
from domain.specs import Pooler
from reconciler.sql import errors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.login_roles import alternate_problems, other_login, retire_on
from reconciler.sql.roles import end_sessions, has_sessions
from reconciler.sql.session import OPERATION_TIMEOUT, Admin, run_operation
from reconciler.sql.tenant import read_state, scram_verifier, validate_tenant_name
from reconciler.sql.tenant_login import OPERATION

ATTEMPTS = SETTINGS.sql.blocked_attempts

# Counts of what the provider did not make: dependencies on roles recorded in the tenant's database
# (objects owned by a role, grants and policies naming one) that its template does not have (behind a
# pooler a tenant database is a copy of the Shard's `client.pooler.template`, with the same objects under
# the same OIDs), of the tenant's role anywhere but its ownership of its database, and grants on the
# database to other roles than the pooler's auth user; parameters set for the database or the role;
# prepared transactions of either; a connection limit on the database.
_FOREIGN = """
SELECT (SELECT count(*) FROM pg_catalog.pg_shdepend s
         WHERE (s.dbid = d.oid AND NOT EXISTS (
                 SELECT 1 FROM pg_catalog.pg_shdepend t JOIN pg_catalog.pg_database td ON td.oid = t.dbid
                  WHERE td.datname = %(template)s AND t.classid = s.classid AND t.objid = s.objid
                    AND t.objsubid = s.objsubid AND t.refclassid = s.refclassid AND t.refobjid = s.refobjid
                    AND t.deptype = s.deptype))
            OR (s.refclassid = 'pg_catalog.pg_authid'::regclass AND s.refobjid = r.oid
                AND NOT (s.classid = 'pg_catalog.pg_database'::regclass AND s.objid = d.oid AND s.deptype = 'o'))
            OR (s.classid = 'pg_catalog.pg_database'::regclass AND s.objid = d.oid AND s.deptype <> 'o'
                AND s.refobjid IS DISTINCT FROM (SELECT a.oid FROM pg_catalog.pg_roles a
                                                  WHERE a.rolname = %(auth_user)s))),
       (SELECT count(*) FROM pg_catalog.pg_db_role_setting x WHERE x.setdatabase = d.oid OR x.setrole = r.oid),
       (SELECT count(*) FROM pg_catalog.pg_prepared_xacts p WHERE p.owner = r.rolname OR p.database = d.datname),
       d.datconnlimit <> -1
  FROM pg_catalog.pg_roles r
  JOIN pg_catalog.pg_database d ON d.datname = r.rolname AND d.datdba = r.oid
 WHERE r.rolname = %(name)s
"""


def findings(conn: psycopg.Connection, name: str, pooler: Pooler | None = None) -> list[str]:
    """What the tenant's role and database hold that the provider did not make (empty: nothing); behind a
    declared `pooler`, its template's objects and the auth user's CONNECT are the provider's doing."""
    state = read_state(conn, name)
    params = {
        "name": name,
        "template": pooler.template if pooler is not None else None,
        "auth_user": pooler.auth_user if pooler is not None else None,
    }
    row = conn.execute(_FOREIGN, params).fetchone()
    if row is None or not state.open:
        return ["the database's privileges or its ALLOW_CONNECTIONS are not the provider's"]
    objects, settings, prepared, limited = row
    found = []
    if objects:
        found.append(f"{objects} object(s) or grant(s) in the database or of the role")
    if settings:
        found.append("parameters set for the database or the role")
    if prepared:
        found.append("prepared transactions")
    if limited:
        found.append("a connection limit on the database")
    found.extend(alternate_problems(conn, name, state))
    return found


def seal_first_login(
    admin: Admin,
    name: str,
    password: str,
    *,
    login: str | None = None,
    pooler: Pooler | None = None,
    timeout: float = OPERATION_TIMEOUT,
) -> list[str]:
    """Take the tenant back after an unbound first login as `login` (the tenant role unless its Secret
    names the alternate) and return `findings` (see the module docstring). With the alternate, the
    tenant role is also left as the provider made it: no login, no password, no session.

    Fails (operation "login") with `conflict` when sessions of the tenant keep appearing.
    """
    validate_tenant_name(name)
    login = login or name
    other_login(name, login)  # validates `login`
    verifier = sql.Literal(scram_verifier(password))
    set_password = sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(login), verifier)

    def body(conn: psycopg.Connection) -> list[str]:
        state = read_state(conn, name)
        oid = state.role_oid if login == name else state.alternate_oid
        if state.role_oid is None:
            raise SqlFailure(OPERATION, errors.NOT_FOUND, detail="the tenant role does not exist")
        if oid is None:
            raise SqlFailure(OPERATION, errors.NOT_FOUND, detail="the alternate login role does not exist")
        roles = {login: oid} if login == name else {login: oid, name: state.role_oid}
        for _ in range(ATTEMPTS):
            with conn.transaction():
                conn.execute(set_password)
                if login != name:
                    retire_on(conn, name, name, end_sessions=False)
                for role, role_oid in roles.items():
                    end_sessions(conn, role, role_oid)
            if not any(has_sessions(conn, role_oid) for role_oid in roles.values()):
                return findings(conn, name, pooler)
        raise SqlFailure(
            OPERATION, errors.CONFLICT, detail="sessions as the tenant kept appearing while its password was set again"
        )

    return run_operation(admin, OPERATION, body, timeout=timeout)
