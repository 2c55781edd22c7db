"""What a tenant sets or takes away in its own database cannot keep another consumer's Database from
being deleted: the running controllers against real PostgreSQL 18, 16 and 15.

A grants B's role SELECT on a table in a schema whose USAGE A then took away from itself, makes its
database read-only for every session, has them start as A, end after 1 ms idle and load a library
that does not exist. B's DELETE still ends with the Database gone and its role dropped, and none of
A's settings changed.
"""

from __future__ import annotations

from psycopg import sql

from tests.reconciler.conftest import secret_data, wait_events
from tests.support.common import wait_for
from tests.support.postgres import tenant_exists


def _settings(postgres, database: str) -> list[tuple[object, ...]]:
    return postgres.query(
        "SELECT setconfig::text FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database"
        " WHERE datname = %s)",
        (database,),
    )


def test_another_tenants_database_settings_do_not_keep_a_database_from_being_dropped(
    postgres, fleet, start_manager, admin_rest
):
    fleet.shard(postgres)
    manager = start_manager()
    granter = fleet.database(f"settings-a{postgres.major}", consumer="rectest-consumer")
    victim = fleet.database(f"settings-b{postgres.major}", consumer="rectest-other")
    fleet.wait_phase(granter, "Ready")
    victim_tenant = fleet.wait_phase(victim, "Ready")["status"]["tenantName"]
    a = secret_data(admin_rest, f"{granter}-credentials")
    names = {"a": sql.Identifier(a["database"]), "b": sql.Identifier(victim_tenant)}
    with postgres.connect(a["user"], a["password"], a["database"], autocommit=True) as conn:
        for statement in (
            "CREATE SCHEMA hidden",
            "CREATE TABLE hidden.orders (id int)",
            "GRANT SELECT ON hidden.orders TO {b}",
            "REVOKE ALL ON SCHEMA hidden FROM PUBLIC, {a}",
            "ALTER DATABASE {a} SET default_transaction_read_only = on",
            "ALTER DATABASE {a} SET role = {a}",
            "ALTER DATABASE {a} SET idle_session_timeout = '1ms'",
            "ALTER DATABASE {a} SET local_preload_libraries = 'no_such_library'",
        ):
            conn.execute(sql.SQL(statement).format(**names))
    settings = _settings(postgres, a["database"])

    fleet.request_delete(victim)

    wait_for(lambda: fleet.get_database(victim) is None, timeout=90, what=f"{victim} dropped and removed")
    assert tenant_exists(postgres, victim_tenant) == (False, False)
    wait_events(admin_rest, victim, {"Dropped"})
    assert manager.errors("database", "DropFailed") == 0
    assert _settings(postgres, a["database"]) == settings and "no_such_library" in str(settings)
