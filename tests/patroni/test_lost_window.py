"""A failover onto a replica that had not received the last commits (docs/operations.md, "A failover that
loses the last commits"): the provider repairs what the promoted primary lacks.

Replication is cut (the primary refuses the replica's walreceiver); then a Database turns Ready on the
primary alone, and another one's password is rotated there. The primary is killed and Patroni promotes
the lagging replica, which has neither. Once the Shard check sees the new timeline, the lost tenant is
provisioned again with the credentials its consumer already has (its data is gone, as it must be), with a
Warning Event that says so, and the rotated password logs in without another rotation. A soft delete's
disable and another database's drop, both lost in the same failover, are done again: the soft-deleted
tenant cannot log in during its retention, and the dropped one is gone again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, ANNOTATION_ROTATE_REQUESTED_AT
from domain.resources import DATABASES
from domain.timefmt import format_time
from harness.patroni import PatroniShard
from informers import Rest
from tests.patroni.conftest import NAMESPACE, RELEASE, Fleet, connect
from tests.support.common import condition, wait_for

pytestmark = pytest.mark.server


@pytest.fixture
def lagging_cluster() -> Iterator[PatroniShard]:
    with PatroniShard("18", replicas=1, pool_mode="transaction") as cluster:
        yield cluster


def cut_replication(cluster: PatroniShard) -> None:
    """The primary refuses replication connections from now on and ends the replica's walsender."""
    leader = cluster.wait_leader()
    hba = leader.workdir / "data" / "pg_hba.conf"
    hba.write_text("host replication all 127.0.0.1/32 reject\n" + hba.read_text())
    with leader.superuser_connection() as conn:
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
    wait_for(
        lambda: cluster.query("SELECT count(*) FROM pg_stat_replication")[0][0] == 0,
        timeout=30,
        what="the replica to stop streaming",
    )


def tenants(cluster: PatroniShard) -> set[str]:
    return {row[0] for row in cluster.query(r"SELECT rolname FROM pg_roles WHERE rolname LIKE 't\_%'")}


def events(rest: Rest, name: str) -> list[dict[str, Any]]:
    items = rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def test_what_a_lagging_failover_lost_is_repaired(
    lagging_cluster: PatroniShard, fleet: Fleet, start_manager, admin_rest: Rest
) -> None:
    cluster = lagging_cluster
    shard = fleet.patroni_shard(cluster)
    start_manager(RELEASE.config(softDelete={"retention": "1h"}))
    kept, rotated = fleet.database("kept"), fleet.database("rotated")
    deleted, dropped = fleet.database("deleted"), fleet.database("dropped")
    for db in (kept, rotated, deleted, dropped):
        fleet.wait_phase(db, "Ready", timeout=120)
    deleted_creds = fleet.credentials(deleted)
    dropped_tenant = fleet.credentials(dropped)["database"]
    before = fleet.credentials(rotated)
    timeline = cluster.timeline()
    wait_for(
        lambda: fleet.get_shard(shard).get("status", {}).get("timeline") == timeline,
        timeout=60,
        what="the Shard to record the primary's timeline",
    )
    cluster.wait_streaming(1)
    wait_for(
        lambda: cluster.query("SELECT bool_and(replay_lsn = pg_current_wal_lsn()) FROM pg_stat_replication")[0][0],
        timeout=60,
        what="the replica to replay everything",
    )
    cut_replication(cluster)
    lost = fleet.database("lost")
    fleet.wait_phase(lost, "Ready", timeout=120)
    lost_creds = fleet.credentials(lost)
    with connect(lost_creds) as conn:
        conn.execute("CREATE TABLE orders (id int)")  # committed on the primary alone
    # A tenant handed out on its alternate login role, by a rotation with an overlap, on the primary alone.
    on_alternate = fleet.database("on-alternate")
    fleet.wait_phase(on_alternate, "Ready", timeout=120)
    tenant_creds = fleet.credentials(on_alternate)
    handed_out = fleet.rotate_with_overlap(on_alternate, 3600)["status"]["loginRole"]
    alternate_creds = fleet.credentials(on_alternate)
    assert alternate_creds["user"] == handed_out != tenant_creds["user"]
    stamp = fleet.annotate_now(rotated, ANNOTATION_ROTATE_REQUESTED_AT)
    fleet.wait_database(rotated, lambda db: db["status"].get("rotationApplied") == stamp, timeout=120)
    rotated_creds = fleet.credentials(rotated)
    assert rotated_creds["password"] != before["password"]
    # A soft delete (disabled for its retention) and a drop (asked for two hours ago: at once).
    fleet.request_delete(deleted)
    fleet.wait_database(deleted, lambda db: (condition(db, "TenantDisabled") or {}).get("status") == "True", 60)
    long_ago = format_time(datetime.now(UTC) - timedelta(hours=2))
    annotations = {ANNOTATION_DELETE_REQUESTED_AT: long_ago}
    admin_rest.patch(DATABASES, dropped, {"metadata": {"annotations": annotations}}, NAMESPACE)
    wait_for(lambda: fleet.get_database(dropped) is None, timeout=60, what="the dropped database gone")
    replica = next(member for member in cluster.members if member is not cluster.wait_leader())
    with replica.superuser_connection() as conn:  # what the promoted replica will have: neither
        row = conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (deleted_creds["user"],))
        assert row.fetchone() == (True,)
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (dropped_tenant,)).fetchone() == (1,)

    killed = cluster.kill_leader()
    cluster.wait_leader(other_than=killed, timeout=120)
    promoted = cluster.timeline()
    assert promoted > timeline
    assert lost_creds["user"] not in tenants(cluster)  # the failover lost it
    assert tenant_creds["user"] not in tenants(cluster)  # and this one, with its alternate
    wait_for(
        lambda: fleet.get_shard(shard).get("status", {}).get("timeline") == promoted,
        timeout=120,
        what="the provider to verify the shard's databases on the new timeline",
    )

    # The lost tenant is back under its name, with the credentials its consumer has; its data is gone.
    assert lost_creds["user"] in tenants(cluster)
    assert fleet.credentials(lost) == lost_creds
    assert fleet.get_database(lost)["status"]["phase"] == "Ready"  # type: ignore[index]
    with connect(lost_creds) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (lost_creds["user"],)
        assert conn.execute("SELECT to_regclass('orders')").fetchone() == (None,)
    recreated = [e for e in events(admin_rest, lost) if e["reason"] == "TenantRecreated"]
    assert len(recreated) == 1 and recreated[0]["type"] == "Warning"
    assert "failover" in recreated[0]["message"] and lost_creds["password"] not in recreated[0]["message"]

    # The tenant on its alternate is made again with both roles: the alternate, handed out, logs in through
    # pgBouncer with the password its consumer has and acts as the tenant; the tenant role has no login and
    # no password, so the credentials from before the rotation are refused.
    assert fleet.credentials(on_alternate) == alternate_creds
    assert fleet.get_database(on_alternate)["status"]["phase"] == "Ready"  # type: ignore[index]
    with connect(alternate_creds) as conn:
        assert conn.execute("SELECT session_user, current_user").fetchone() == (
            alternate_creds["user"],
            tenant_creds["user"],
        )
    with pytest.raises(psycopg.OperationalError):
        connect(tenant_creds).close()
    logins = cluster.query(
        "SELECT rolname, rolcanlogin, rolpassword IS NULL FROM pg_authid WHERE rolname = ANY(%s) ORDER BY 1",
        ([tenant_creds["user"], alternate_creds["user"]],),
    )
    assert logins == [(tenant_creds["user"], False, True), (alternate_creds["user"], True, False)]
    assert [e["reason"] for e in events(admin_rest, on_alternate)].count("TenantRecreated") == 1

    # The rotation the failover lost holds without another one: the new password in, the old one out.
    assert fleet.get_database(rotated)["status"]["rotationApplied"] == stamp  # type: ignore[index]
    with connect(rotated_creds) as conn:
        conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        connect(rotated_creds, password=before["password"]).close()
    with connect(fleet.credentials(kept)) as conn:
        conn.execute("SELECT 1")

    # The lost disable and the lost drop are done again.
    with pytest.raises(psycopg.OperationalError):
        connect(deleted_creds).close()
    assert deleted_creds["user"] in tenants(cluster)  # kept, disabled, for its retention
    assert dropped_tenant not in tenants(cluster)
    disabled_again = [e for e in events(admin_rest, deleted) if e["reason"] == "TenantDisabledAgain"]
    assert len(disabled_again) == 1 and disabled_again[0]["type"] == "Warning"
