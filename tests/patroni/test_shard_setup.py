"""The commands docs/install.md ("Shards behind pgBouncer") gives a shard's administrators, run as written
against a Patroni shard: a tenant made while consumers reached PostgreSQL itself logs in through pgBouncer
once they ran.

(The shard-wide setting of that section runs on every harness cluster: harness/patroni.py reads it.)
"""

from __future__ import annotations

import os
import re
import subprocess

import psycopg
import pytest

from harness.patroni import SERVER_TLS_SSLMODE, PatroniShard
from tests.patroni.conftest import Fleet, connect
from tests.support.common import wait_for
from tests.support.documented import REPO, blocks_run_by

pytestmark = pytest.mark.server
INSTALL = REPO / "docs" / "install.md"


def run_as_superuser(cluster: PatroniShard, block: str, tenant: str) -> None:
    """The block with bash on the primary's socket as its superuser (the server's own psql and pg_dump
    first on PATH); its `tenant=` line gets the real tenant's name."""
    leader = cluster.wait_leader()
    script = "set -euo pipefail\n" + "".join(
        f"tenant={tenant}\n" if line.startswith("tenant=") else line + "\n" for line in block.splitlines()
    )
    env = {
        **os.environ,
        "PATH": f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": str(cluster.bin_dir.parent / "lib"),
        "PGHOST": str(leader.socket_dir),
        "PGPORT": str(leader.pg_port),
        "PGUSER": PatroniShard.SUPERUSER,
    }
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"the documented commands failed: {result.stdout}{result.stderr}"


def test_a_tenant_made_before_pgbouncer_logs_in_through_it_after_the_documented_commands(
    patroni18: PatroniShard, fleet: Fleet, start_manager
) -> None:
    cluster = patroni18
    fleet.patroni_shard(cluster, direct=True)  # consumers reach PostgreSQL itself: no pooler
    start_manager()
    name = fleet.database("before-pgbouncer")
    fleet.wait_reason(name, "Ready", "Provisioned", timeout=120)
    creds = fleet.credentials(name)
    through_pgbouncer = {**creds, "port": str(cluster.client_port)}
    with pytest.raises(psycopg.OperationalError):
        connect(through_pgbouncer).close()  # no auth function in its database, no CONNECT for the pooler

    blocks = blocks_run_by(INSTALL, "tests/patroni/test_shard_setup.py")
    assert len(blocks) == 1, "docs/install.md marks one block for this test"
    run_as_superuser(cluster, blocks[0], creds["database"])

    def logs_in() -> psycopg.Connection | None:
        try:
            return connect(through_pgbouncer)
        except psycopg.OperationalError:
            return None  # pgBouncer waits server_login_retry (15 s) after the failed login above

    conn = wait_for(logs_in, timeout=60, what="a login through pgBouncer")
    with conn:
        conn.execute("CREATE TABLE t (id int)")
        assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)
    rows = cluster.query(
        "SELECT has_database_privilege('_crunchypgbouncer', %s, 'CONNECT'), "
        "has_database_privilege('public', %s, 'CONNECT')",
        (creds["database"], creds["database"]),
    )
    assert rows == [(True, False)]  # the pooler may connect, PUBLIC still may not


def test_pgbouncer_verifies_the_server_as_docs_install_md_says(
    patroni18: PatroniShard, fleet: Fleet, start_manager
) -> None:
    """docs/install.md names the `server_tls_sslmode` of Percona's pgBouncer; the harness's pgBouncer runs
    with it, and a tenant's login through pgBouncer gets past it on TLS (the member's certificate names
    the address pgBouncer dials)."""
    documented = re.search(r"`server_tls_sslmode = ([a-z-]+)`", INSTALL.read_text())
    assert documented is not None, "docs/install.md names no server_tls_sslmode"
    assert documented.group(1) == SERVER_TLS_SSLMODE == "verify-full"
    config = {row.split("|")[0]: row.split("|")[1] for row in patroni18.pgbouncer_admin("SHOW CONFIG").splitlines()}
    assert config["server_tls_sslmode"] == "verify-full"
    fleet.patroni_shard(patroni18)
    start_manager()
    name = fleet.database("server-tls")
    fleet.wait_phase(name, "Ready", timeout=120)
    with connect(fleet.credentials(name)) as conn:  # pgBouncer's server connection, seen from the server
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
