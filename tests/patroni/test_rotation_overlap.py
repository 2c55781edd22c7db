"""A rotation with an overlap as consumers behind pgBouncer have it (docs/operations.md, "Credentials";
docs/api.md): real client logins through pgBouncer, which learns each login role by its auth_query.

During the overlap both the previous and the new credentials log in through pgBouncer and act as the
tenant; at its end the previous login role is refused for every new client; rotations go back and
forth between the tenant role and its alternate. A client already connected through pgBouncer with
the previous login keeps what pgBouncer holds for it: its server session in session pool mode; in
transaction pool mode the pooled server connections of that login, and it is refused as soon as
pgBouncer has to open a new one for it.
"""

from __future__ import annotations

import psycopg
import pytest

from domain.naming import alternate_name
from harness.patroni import PatroniShard
from tests.patroni.conftest import Fleet, connect, ready_database

pytestmark = pytest.mark.server

# Long enough for the checks made during it under a loaded machine, short enough for the serial CI part.
OVERLAP = 15
QUERY_WAIT_TIMEOUT = 3  # seconds; pgBouncer's own (120 by default) is set back afterwards


def overlap_ended(fleet: Fleet, name: str) -> None:
    fleet.wait_database(
        name, lambda db: not db["status"].get("retireLoginAt"), timeout=OVERLAP + 60, what="the overlap to end"
    )


def refusal(creds: dict[str, str]) -> str | None:
    """Why pgBouncer refuses a new client with these credentials (None: it logged in)."""
    try:
        connect(creds).close()
    except psycopg.OperationalError as exc:
        return str(exc)
    return None


def refused(creds: dict[str, str]) -> bool:
    return refusal(creds) is not None


def who(conn: psycopg.Connection) -> tuple[str, str]:
    row = conn.execute("SELECT session_user, current_user").fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def pgbouncer_log(cluster: PatroniShard) -> str:
    assert cluster.pgbouncer is not None
    return cluster.pgbouncer.log_file.read_text(errors="replace")


def pgbouncer_setting(cluster: PatroniShard, key: str) -> str:
    """A setting as pgBouncer's SHOW CONFIG shows it (key|value|default|changeable)."""
    values = [
        line.split("|")[1] for line in cluster.pgbouncer_admin("SHOW CONFIG").splitlines() if line.startswith(f"{key}|")
    ]
    assert len(values) == 1, f"pgBouncer shows no {key}"
    return values[0]


def owners(cluster: PatroniShard, database: str) -> dict[str, str]:
    rows = cluster.query("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'", dbname=database)
    return {str(table): str(owner) for table, owner in rows}


@pytest.mark.parametrize("pool", ["patroni18", "patroni16"])
def test_during_an_overlap_both_logins_act_as_the_tenant_through_pgbouncer_and_the_old_one_stops_at_its_end(
    pool: str, request: pytest.FixtureRequest, fleet: Fleet, start_manager
) -> None:
    cluster: PatroniShard = request.getfixturevalue(pool)
    name = ready_database(fleet, cluster, start_manager, "overlap")
    old = fleet.credentials(name)
    tenant = old["user"]
    held = connect(old)  # a consumer connected before the rotation, still connected after the overlap
    try:
        assert who(held) == (tenant, tenant)

        db = fleet.rotate_with_overlap(name, OVERLAP)
        new = fleet.credentials(name)
        assert (new["user"], new["database"]) == (alternate_name(tenant), tenant)
        assert db["status"]["loginRole"] == new["user"] and db["status"]["retireLoginAt"]

        # Both log in through pgBouncer as new clients, and what either creates belongs to the tenant.
        with connect(old) as before, connect(new) as after:
            assert who(before) == (tenant, tenant)
            assert who(after) == (new["user"], tenant)
            before.execute("CREATE TABLE made_before (id int)")
            after.execute("CREATE TABLE made_after (id int)")
            after.execute("INSERT INTO made_before VALUES (1)")
            before.execute("INSERT INTO made_after VALUES (2)")
            assert before.execute("SELECT count(*) FROM made_after").fetchone() == (1,)
            assert after.execute("SELECT count(*) FROM made_before").fetchone() == (1,)
        assert owners(cluster, tenant) == {"made_before": tenant, "made_after": tenant}
        assert fleet.get_database(name)["status"].get("retireLoginAt"), "the overlap ended during its checks"  # type: ignore[index]

        overlap_ended(fleet, name)
        # pgBouncer's auth_query finds no login for the retired role: every new client with it is refused,
        # though pgBouncer still pools server connections of that role.
        assert "no such user" in (refusal(old) or "")
        with connect(new) as conn:
            assert who(conn) == (new["user"], tenant)
        # A client connected before keeps running on what pgBouncer holds for it (its server session in
        # session mode, the role's pooled server connections in transaction mode)...
        assert who(held) == (tenant, tenant)
        # ...until pgBouncer has to open a server connection for it (its server_lifetime or
        # server_idle_timeout closed the pooled ones; RECONNECT does so now): the retired role cannot log in.
        cluster.pgbouncer_admin(f"RECONNECT {tenant}")
        if cluster.pool_mode == "transaction":
            # pgBouncer keeps the client waiting while its server logins fail, up to query_wait_timeout.
            configured = pgbouncer_setting(cluster, "query_wait_timeout")
            cluster.pgbouncer_admin(f"SET query_wait_timeout = {QUERY_WAIT_TIMEOUT}")
            try:
                with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"):
                    held.execute("SELECT 1")
            finally:
                cluster.pgbouncer_admin(f"SET query_wait_timeout = {configured}")
            # No password is left for the retired role: the server refuses pgBouncer's login with it.
            assert f'server login failed: FATAL password authentication failed for user "{tenant}"' in pgbouncer_log(
                cluster
            )
        else:
            assert who(held) == (tenant, tenant)
    finally:
        held.close()


def test_rotations_back_and_forth_between_the_two_logins_through_pgbouncer(
    patroni18: PatroniShard, fleet: Fleet, start_manager
) -> None:
    """The tenant role, its alternate, the tenant role again (pgBouncer in transaction mode still pools
    server connections the tenant role opened with its first password): each login role logs in with
    the password it was last handed out with, and only while it is handed out or its overlap runs."""
    cluster = patroni18
    name = ready_database(fleet, cluster, start_manager, "back-and-forth")
    first = fleet.credentials(name)
    tenant = first["user"]
    with connect(first) as conn:
        conn.execute("CREATE TABLE first (id int)")  # a server connection of the tenant role stays pooled

    fleet.rotate_with_overlap(name, 3600)  # ended by the next rotation
    second = fleet.credentials(name)
    assert second["user"] == alternate_name(tenant)
    with connect(first) as conn, connect(second) as alt:
        assert who(conn) == (tenant, tenant)
        alt.execute("CREATE TABLE second (id int)")

    db = fleet.rotate_with_overlap(name, OVERLAP)
    third = fleet.credentials(name)
    assert third["user"] == tenant and third["password"] not in (first["password"], second["password"])
    assert not db["status"].get("loginRole") and db["status"]["retireLoginAt"]
    # The credentials of two rotations ago stop: the tenant role has a new password, though pgBouncer
    # still pools its server connections opened with the first one.
    assert refused(first)
    with connect(third) as conn, connect(second) as alt:
        assert who(conn) == (tenant, tenant)
        assert who(alt) == (second["user"], tenant)
        alt.execute("CREATE TABLE third (id int)")
        assert conn.execute("SELECT count(*) FROM third").fetchone() == (0,)
    assert owners(cluster, tenant) == {"first": tenant, "second": tenant, "third": tenant}
    assert fleet.get_database(name)["status"].get("retireLoginAt"), "the overlap ended during its checks"  # type: ignore[index]

    overlap_ended(fleet, name)
    assert refused(second)
    assert refused(first)
    with connect(third) as conn:
        assert who(conn) == (tenant, tenant)
    roles = cluster.query(
        "SELECT rolname, rolcanlogin, rolpassword IS NULL FROM pg_authid WHERE rolname = ANY(%s) ORDER BY 1",
        ([tenant, second["user"]],),
    )
    assert roles == [(tenant, True, False), (second["user"], False, True)]
