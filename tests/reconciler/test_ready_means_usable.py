"""Ready means usable: a database is Ready only once a fresh session with its own credentials logged in.

Real PostgreSQL 18 and kube-apiserver. The client endpoint of a Shard is what consumers are handed;
the login goes there (`readiness.loginThrough: client`, the default) or to the admin endpoint's
server (`admin`). A postmaster that accepts no new session (SIGSTOP) while the workers' old sessions
still answer must not let a database turn Ready.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from domain.resources import SHARDS
from harness import PostgresServer
from harness.tcp_proxy import TcpProxy
from tests.reconciler.causes import wait_reason
from tests.reconciler.conftest import RELEASE, Fleet
from tests.support.common import condition


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    with PostgresServer("18") as created:
        yield created


def test_a_client_endpoint_that_does_not_log_in_keeps_the_database_provisioning(
    server: PostgresServer, fleet: Fleet, start_manager, admin_rest
) -> None:
    with TcpProxy("127.0.0.1", server.port) as proxy:
        proxy.blackhole()  # the client endpoint (e.g. pgBouncer) accepts and never answers
        shard = fleet.shard(server, client_port=proxy.port)
        start_manager()
        name = fleet.database("no-login")
        db = wait_reason(fleet, name, "LoginFailed", timeout=60)
        assert db["status"]["phase"] == "Provisioning"
        message = condition(db, "Ready")["message"]
        assert message.startswith("login failed: timeout") and f"127.0.0.1:{proxy.port}" in message
        creds = fleet.credentials(name)
        assert creds["password"] not in message
        # The tenant exists on the shard; only the login through the client endpoint is missing.
        with server.connect(creds["user"], creds["password"], creds["database"]) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (creds["user"],)

        # The platform engineer fixes the client endpoint: the database is Ready.
        admin_rest.patch(SHARDS, shard, {"spec": {"client": {"port": server.port}}})
        fleet.wait_reason(name, "Ready", "Provisioned", timeout=90)


def test_login_through_the_admin_endpoint_when_the_client_endpoint_is_out_of_reach(
    server: PostgresServer, fleet: Fleet, start_manager
) -> None:
    # A client endpoint only consumers can reach (nothing listens there for the provider).
    fleet.shard(server, client_host="10.255.255.1", client_port=6432)
    start_manager(RELEASE.config(readiness={"loginThrough": "admin"}))
    name = fleet.database("via-admin")
    db = fleet.wait_reason(name, "Ready", "Provisioned", timeout=60)
    assert fleet.credentials(name)["host"] == "10.255.255.1"  # consumers still get their endpoint
    assert db["status"]["phase"] == "Ready"


def test_a_postmaster_that_accepts_nobody_lets_no_database_turn_ready(
    server: PostgresServer, fleet: Fleet, start_manager
) -> None:
    fleet.shard(server)
    start_manager()
    first = fleet.database("warm")
    fleet.wait_phase(first, "Ready")  # the workers hold open admin sessions now
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the postmaster only: old sessions answer, new ones get nowhere
    try:
        names = [fleet.database(f"stopped-{i}") for i in range(3)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for name in names:
                db = fleet.get_database(name)
                assert (db.get("status") or {}).get("phase") != "Ready", f"{name} Ready while nobody can log in"
            time.sleep(0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    for name in names:
        fleet.wait_phase(name, "Ready", timeout=90)
        creds = fleet.credentials(name)
        with server.connect(creds["user"], creds["password"], creds["database"]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
