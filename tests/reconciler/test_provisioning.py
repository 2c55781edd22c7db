"""A Database goes Ready on PostgreSQL 18, 16 and 15 and its credentials work; nobody else gets in."""

from __future__ import annotations

import psycopg
import pytest

from harness import PostgresServer
from tests.reconciler.conftest import condition, secret_data


def test_database_goes_ready_and_its_credentials_connect(postgres: PostgresServer, fleet, start_manager, admin_rest):
    # The client endpoint names the server otherwise than the admin one: the Secret carries the client's.
    shard = fleet.shard(postgres, client_host="localhost")
    start_manager()
    name = fleet.database(f"orders{postgres.major}", size_class="small")
    db = fleet.wait_phase(name, "Ready")
    status = db["status"]
    assert status["shard"] == shard
    assert condition(db, "Ready")["reason"] == "Provisioned"
    assert status["appliedConnectionLimit"] == 5
    assert "db.bnerd.com/tenant" in db["metadata"]["finalizers"]

    creds = secret_data(admin_rest, f"{name}-credentials")
    assert set(creds) == {"host", "port", "database", "user", "password", "sslmode"}
    assert (creds["host"], creds["port"], creds["sslmode"]) == ("localhost", str(postgres.port), "require")
    assert creds["database"] == creds["user"] == status["tenantName"]
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
        limit = conn.execute("SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    assert limit == 5

    # The provisioner cannot connect to the tenant database, and neither can an unrelated role.
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        postgres.provisioner_connection(creds["database"])
    with postgres.superuser_connection() as su:
        su.execute("DROP ROLE IF EXISTS rectest_public")
        su.execute("CREATE ROLE rectest_public LOGIN PASSWORD 'public-pw'")
    try:
        with pytest.raises(psycopg.OperationalError, match="permission denied"):
            postgres.connect("rectest_public", "public-pw", creds["database"])
    finally:
        with postgres.superuser_connection() as su:
            su.execute("DROP ROLE rectest_public")
