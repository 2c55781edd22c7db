"""A failover onto a replica that had not received the last commits (docs/operations.md, "A failover that
loses the last commits"): a tenant made in that window says Ready while the promoted primary lacks it.

Replication is cut (the primary refuses the replica's walreceiver), a Database turns Ready on the primary
alone, the primary is killed and Patroni promotes the lagging replica. The documented query finds the
tenant missing there, its consumer cannot log in, the tenants made before the cut are intact, and deleting
and creating the Database again gives its consumer working credentials.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from harness.patroni import PatroniShard
from tests.patroni.conftest import Fleet, connect
from tests.support.common import wait_for

pytestmark = pytest.mark.server
MISSING_TENANTS = r"SELECT rolname FROM pg_roles WHERE rolname LIKE 't\_%'"  # docs/operations.md


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


def test_a_tenant_made_in_the_lost_window_is_missing_after_the_failover(
    lagging_cluster: PatroniShard, fleet: Fleet, start_manager
) -> None:
    cluster = lagging_cluster
    shard = fleet.patroni_shard(cluster)
    start_manager()
    kept = fleet.database("kept")
    fleet.wait_phase(kept, "Ready", timeout=120)
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

    killed = cluster.kill_leader()
    cluster.wait_leader(other_than=killed, timeout=120)
    fleet.wait_shard(shard, "Ok", timeout=120)

    tenants = {row[0] for row in cluster.query(MISSING_TENANTS)}
    assert fleet.credentials(kept)["user"] in tenants
    assert lost_creds["user"] not in tenants
    assert fleet.get_database(lost)["status"]["phase"] == "Ready"  # type: ignore[index]
    with pytest.raises(psycopg.OperationalError):
        connect(lost_creds).close()
    with connect(fleet.credentials(kept)) as conn:
        conn.execute("SELECT 1")

    fleet.request_delete(lost)
    wait_for(lambda: fleet.get_database(lost) is None, timeout=120, what="the lost tenant's Database to go")
    again = fleet.database("lost")
    fleet.wait_phase(again, "Ready", timeout=120)
    creds = fleet.credentials(again)
    with connect(creds) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)
