"""What a tenant may set or take away in its own database cannot stop another tenant's drop.

Tenant A (`granter`) grants tenant B's role (`victim`) something in A's database, so B's drop has to
enter A's database and revoke it as A. A, the owner, may set parameters for every session in its
database (`ALTER DATABASE a SET ...`, `ALTER ROLE ALL IN DATABASE a SET ...`) and for its own role, and
may revoke USAGE on its schemas from anyone, itself included. None of it keeps B's role alive, and
A's settings and privileges are as A left them afterwards. Every test runs on PostgreSQL 18, 16 and 15.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import TenantSpec, drop_tenant, tenant_state
from tests.sql.helpers import as_tenant
from tests.support.postgres import catalog_counts


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def _grant_table(postgres: PostgresServer, granter: TenantSpec, victim: TenantSpec) -> None:
    with as_tenant(postgres, granter) as conn:
        conn.execute(sql.SQL("GRANT SELECT ON s.t TO {}").format(_ident(victim.name)))


def _settings(postgres: PostgresServer, granter: TenantSpec) -> list[tuple[str, ...]]:
    """What is set for sessions in A's database and for A's role (pg_db_role_setting), in order."""
    return [
        tuple(row)
        for row in postgres.query(
            "SELECT coalesce(d.datname, ''), coalesce(r.rolname, ''), s.setconfig::text FROM pg_db_role_setting s"
            " LEFT JOIN pg_database d ON d.oid = s.setdatabase LEFT JOIN pg_roles r ON r.oid = s.setrole"
            " WHERE d.datname = %(a)s OR r.rolname = %(a)s ORDER BY 1, 2",
            {"a": granter.name},
        )
    ]


def _dropped_and_untouched(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, settings: object
) -> None:
    assert catalog_counts(postgres, victim.name) == (0, 0)
    assert _settings(postgres, granter) == settings
    assert tenant_state(admin, granter.name).provisioned
    [(acl,)] = postgres.query("SELECT datacl::text[] FROM pg_database WHERE datname = %s", (granter.name,))
    assert not [item for item in acl if item.startswith(f"{postgres.PROVISIONER}=")]


# -- parameters the owner sets for every session in its database ----------------------------------

# Case -> (the statements A runs, {a} its database and role; the first major that has the parameter).
SETTINGS: dict[str, tuple[list[str], int]] = {
    "read-only": (["ALTER DATABASE {a} SET default_transaction_read_only = on"], 0),
    "role": (
        ["ALTER DATABASE {a} SET role = {a}", "ALTER DATABASE {a} SET session_authorization = {a}"],
        0,
    ),
    "transaction-timeout": (["ALTER DATABASE {a} SET transaction_timeout = '1ms'"], 17),
    "other-timeouts": (
        [
            "ALTER DATABASE {a} SET idle_session_timeout = '1ms'",
            "ALTER DATABASE {a} SET idle_in_transaction_session_timeout = '1ms'",
            "ALTER DATABASE {a} SET statement_timeout = '1ms'",
            "ALTER DATABASE {a} SET lock_timeout = '1ms'",
            "ALTER DATABASE {a} SET exit_on_error = on",
        ],
        0,
    ),
    "preload-library": (["ALTER DATABASE {a} SET local_preload_libraries = 'no_such_library'"], 0),
    "how-names-read": (
        ["ALTER DATABASE {a} SET client_encoding = 'LATIN1'", "ALTER DATABASE {a} SET search_path = s, public"],
        0,
    ),
    "role-level": (
        [
            "ALTER ROLE ALL IN DATABASE {a} SET default_transaction_read_only = on",
            "ALTER ROLE {a} SET default_transaction_read_only = on",
            "ALTER ROLE {a} SET statement_timeout = '1ms'",
        ],
        0,
    ),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_what_the_granter_sets_for_sessions_in_its_database_does_not_stop_the_drop(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, case: str
) -> None:
    statements, since = SETTINGS[case]
    a = _ident(granter.name)
    with as_tenant(postgres, granter) as conn:
        # A name only UTF-8 spells: a session in the client encoding A chose could not even read it.
        conn.execute('CREATE TABLE s."表" (id int)')
        conn.execute(sql.SQL('GRANT SELECT ON s."表", s.t TO {}').format(_ident(victim.name)))
        if postgres.major < since:
            with pytest.raises(psycopg.errors.UndefinedObject):  # no such parameter before `since`
                conn.execute(sql.SQL(statements[0]).format(a=a))
        else:
            for statement in statements:
                conn.execute(sql.SQL(statement).format(a=a))
    settings = _settings(postgres, granter)
    assert bool(settings) is (postgres.major >= since)

    drop_tenant(admin, victim.name)

    _dropped_and_untouched(postgres, admin, granter, victim, settings)


# Controls: what a plain login into A's database (the provisioner's, as before) gets from A's settings.
CONTROLS: dict[str, tuple[str, str, object]] = {
    "read-only": ("default_transaction_read_only = on", "SHOW default_transaction_read_only", ("on",)),
    "role": ("role = {a}", "SELECT current_user::text", ("{a}",)),
    "preload-library": ("local_preload_libraries = 'no_such_library'", "", "no_such_library"),
    "client-encoding": ("client_encoding = 'LATIN1'", "SHOW client_encoding", ("LATIN1",)),
}


@pytest.mark.parametrize("case", sorted(CONTROLS))
def test_without_the_overrides_a_login_into_the_database_gets_the_owners_settings(
    postgres: PostgresServer, provisioned: TenantSpec, case: str
) -> None:
    """Control of the tests above: what they set would reach the provisioner's session without its overrides."""
    setting, query, expected = CONTROLS[case]
    a = _ident(provisioned.name)
    with as_tenant(postgres, provisioned) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {a} SET " + setting).format(a=a))
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(a, _ident(postgres.PROVISIONER)))
    if isinstance(expected, str):
        with pytest.raises(psycopg.OperationalError, match=expected):
            postgres.provisioner_connection(provisioned.name)
        return
    with postgres.provisioner_connection(provisioned.name) as conn:
        assert conn.execute(query).fetchone() == tuple(str(v).format(a=provisioned.name) for v in expected)


def test_no_parameter_a_tenant_sets_for_its_database_starts_the_providers_session_there(
    postgres: PostgresServer, provisioned: TenantSpec
) -> None:
    """A tenant cannot set parameters for the provisioner's own logins, in its database or anywhere."""
    with as_tenant(postgres, provisioned) as conn:
        for scope in ("ALTER ROLE {p} IN DATABASE {a} SET", "ALTER ROLE {p} SET"):
            statement = sql.SQL(scope + " default_transaction_read_only = on").format(
                p=_ident(postgres.PROVISIONER), a=_ident(provisioned.name)
            )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


# -- every parameter a database owner may set, at hostile values ------------------------------------

# Hostile values for the parameters of type string (the others are derived from pg_settings); a
# parameter of a later release that is missing here fails the sweep, so that someone looks at it.
HOSTILE_STRINGS: dict[str, list[str]] = {
    "DateStyle": ["SQL, DMY", "German", "Postgres, YMD", "ISO, DMY"],
    "TimeZone": ["Pacific/Chatham", "America/St_Johns"],
    "application_name": ["not the provider"],
    "client_encoding": ["LATIN1", "SQL_ASCII", "WIN1252", "EUC_JP"],
    "createrole_self_grant": ["set, inherit"],
    "default_table_access_method": ["heap"],
    "default_tablespace": ["no_such_tablespace"],
    "default_text_search_config": ["pg_catalog.english"],
    "lc_monetary": ["C"],
    "lc_numeric": ["C"],
    "lc_time": ["C"],
    "local_preload_libraries": ["no_such_library"],
    "restrict_nonsystem_relation_kind": ["view", "foreign-table"],
    "search_path": ["s", "pg_temp"],
    "temp_tablespaces": ["no_such_tablespace"],
    "timezone_abbreviations": ["Australia", "India"],
    # Not in pg_settings, but settable per database: who the session is.
    "role": ["{a}"],
    "session_authorization": ["{a}"],
}
SWEEPS = 4  # each parameter takes up to this many different values, one sweep after the other


def _hostile_value(row: tuple[str, str, str | None, str | None, list[str] | None, str | None], sweep: int) -> str:
    """The value of a parameter (a pg_settings row) in one sweep: off the default, and for numbers the
    smallest positive, the largest and the smallest value in turn."""
    name, vartype, low, high, choices, default = row
    if vartype == "bool":
        return "off" if (default == "on") is (sweep % 2 == 0) else "on"
    if vartype == "enum":
        others = [choice for choice in choices or [] if choice != default] or [str(default)]
        return others[sweep % len(others)]
    if vartype in ("integer", "real"):
        assert low is not None and high is not None
        smallest_positive = str(max(float(low), 1.0 if vartype == "integer" else 0.001))
        value = [smallest_positive, high, low][sweep % 3]
        return str(int(float(value))) if vartype == "integer" else value
    values = HOSTILE_STRINGS[name]
    return values[sweep % len(values)]


@pytest.mark.parametrize("sweep", range(SWEEPS))
def test_no_parameter_a_database_owner_may_set_stops_the_drop(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, sweep: int
) -> None:
    """Every parameter a tenant may set for its database (context `user`), each at a hostile value, all
    at once, for the database and for A's own role; B's drop cleans grants of every kind in there."""
    rows = postgres.query(
        "SELECT name, vartype, min_val, max_val, enumvals, boot_val FROM pg_settings WHERE context = 'user'"
        " ORDER BY name"
    )
    rows += [(name, "string", None, None, None, None) for name in ("role", "session_authorization")]
    missing = [name for name, vartype, *_ in rows if vartype == "string" and name not in HOSTILE_STRINGS]
    assert not missing, f"no hostile value for {missing}: add them to HOSTILE_STRINGS"
    b = _ident(victim.name)
    with as_tenant(postgres, granter) as conn:
        for statement in (
            "CREATE FUNCTION s.f(s.t) RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "GRANT EXECUTE ON FUNCTION s.f(s.t) TO {b}",
            "GRANT SELECT ON s.t TO {b}",
            "GRANT USAGE ON SCHEMA s TO {b}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA s GRANT SELECT ON TABLES TO {b}",
            "ALTER TABLE s.t ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY for_b ON s.t TO {b} USING (true)",
        ):
            conn.execute(sql.SQL(statement).format(b=b))
        refused = []
        for row in rows:
            value = _hostile_value(row, sweep).format(a=granter.name)
            for scope in ("DATABASE", "ROLE"):
                try:
                    conn.execute(
                        sql.SQL("ALTER {} {} SET {} = {}").format(
                            sql.SQL(scope), _ident(granter.name), _ident(row[0]), sql.Literal(value)
                        )
                    )
                except psycopg.errors.InsufficientPrivilege:
                    refused.append(f"{scope} {row[0]}")  # a value only a superuser may set
                except (
                    psycopg.errors.InvalidParameterValue,  # not on this build (lz4, clone, ...)
                    psycopg.errors.FeatureNotSupported,
                    psycopg.errors.ActiveSqlTransaction,  # transaction_*: only inside a transaction
                ):
                    refused.append(f"{scope} {row[0]}={value}")
    assert len(refused) < len(rows) // 10, refused
    settings = _settings(postgres, granter)
    assert "default_transaction_read_only" in str(settings) and "local_preload_libraries" in str(settings)

    drop_tenant(admin, victim.name)

    _dropped_and_untouched(postgres, admin, granter, victim, settings)


# -- USAGE on a schema, taken away ------------------------------------------------------------------


def _nspacls(postgres: PostgresServer, database: str) -> list[tuple[str, str]]:
    with postgres.superuser_connection(database) as su:
        rows = su.execute(
            "SELECT nspname, coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%'"
            " AND nspname <> 'information_schema' ORDER BY 1"
        ).fetchall()
    return [tuple(row) for row in rows]


# Case -> what A runs ({a} its role, {b} B's role) before taking USAGE on its schemas away.
WITHOUT_USAGE: dict[str, list[str]] = {
    "table": ["GRANT SELECT ON s.t TO {b}"],
    "routine-with-an-argument-type-elsewhere": [
        "CREATE SCHEMA types",
        "CREATE TYPE types.ty AS (x int)",
        "CREATE FUNCTION public.f(types.ty) RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "GRANT EXECUTE ON FUNCTION public.f(types.ty) TO {b}",
        "REVOKE USAGE ON SCHEMA types FROM PUBLIC, {a}",
    ],
    "policy": ["ALTER TABLE s.t ENABLE ROW LEVEL SECURITY", "CREATE POLICY for_b ON s.t TO {b} USING (true)"],
    "owned-by-pg_database_owner": [
        "CREATE TABLE public.u (id int)",
        "ALTER TABLE public.u OWNER TO pg_database_owner",
        "GRANT SELECT ON public.u TO {b}",
        "ALTER DEFAULT PRIVILEGES FOR ROLE pg_database_owner GRANT SELECT ON TABLES TO {b}",
        "REVOKE ALL ON SCHEMA public FROM PUBLIC, pg_database_owner",
    ],
}


@pytest.mark.parametrize("case", sorted(WITHOUT_USAGE))
def test_a_schema_whose_usage_the_granter_took_away_does_not_stop_the_drop(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec, case: str
) -> None:
    names = {"a": _ident(granter.name), "b": _ident(victim.name)}
    with as_tenant(postgres, granter) as conn:
        for statement in [*WITHOUT_USAGE[case], "REVOKE ALL ON SCHEMA s FROM PUBLIC, {a}"]:
            conn.execute(sql.SQL(statement).format(**names))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # control: A cannot name its table now
            conn.execute("SELECT count(*) FROM s.t")
    before = _nspacls(postgres, granter.name)
    settings = _settings(postgres, granter)

    drop_tenant(admin, victim.name)

    _dropped_and_untouched(postgres, admin, granter, victim, settings)
    assert _nspacls(postgres, granter.name) == before  # A's schemas' privileges: as A left them


# -- what the provider cannot get past is retried, and says what was in the way ------------------


@contextmanager
def _schema_of_a_role_the_provider_did_not_create(
    postgres: PostgresServer, granter: TenantSpec
) -> Iterator[sql.Identifier]:
    """A schema in A's database owned by a role of the operator's, in which A may create (USAGE, CREATE)."""
    owner = _ident(f"ops_{granter.name}")
    with postgres.superuser_connection(granter.name) as su:
        su.execute(sql.SQL("CREATE ROLE {}").format(owner))
        su.execute(sql.SQL("CREATE SCHEMA ops AUTHORIZATION {}").format(owner))
        su.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA ops TO {}").format(_ident(granter.name)))
    try:
        yield owner
    finally:
        with postgres.superuser_connection(granter.name) as su:
            su.execute("DROP SCHEMA ops CASCADE")
            su.execute(sql.SQL("DROP ROLE {}").format(owner))


def test_a_grant_the_provider_cannot_reach_is_retried_and_names_the_obstacle(
    postgres: PostgresServer, admin: AdminSession, granter: TenantSpec, victim: TenantSpec
) -> None:
    """A's table in a schema whose owner (not a tenant) then took USAGE away from A: the grant to B
    cannot be named, so the drop fails, retryable, saying so, and completes once USAGE is back."""
    with _schema_of_a_role_the_provider_did_not_create(postgres, granter):
        with as_tenant(postgres, granter) as conn:
            conn.execute("CREATE TABLE ops.t (id int)")
            conn.execute(sql.SQL("GRANT SELECT ON ops.t TO {}").format(_ident(victim.name)))
        with postgres.superuser_connection(granter.name) as su:
            su.execute(sql.SQL("REVOKE USAGE ON SCHEMA ops FROM {}").format(_ident(granter.name)))

        with pytest.raises(SqlFailure) as failure:
            drop_tenant(admin, victim.name)

        assert failure.value.error_class == "insufficient_privilege" and failure.value.retryable
        assert str(failure.value) == (
            "drop failed: insufficient_privilege (what other tenants granted to the tenant role could not be "
            "removed yet: a privilege the cleanup needs was denied; retried)"
        )
        assert catalog_counts(postgres, victim.name) == (1, 0)  # the database is gone, the closed role stays

        with postgres.superuser_connection(granter.name) as su:
            su.execute(sql.SQL("GRANT USAGE ON SCHEMA ops TO {}").format(_ident(granter.name)))
        drop_tenant(admin, victim.name)
        assert catalog_counts(postgres, victim.name) == (0, 0)
