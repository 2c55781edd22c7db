"""`dbprovider dev` runs the whole product: a consumer goes from PUT to a working database, using only
the env file it writes, and SIGTERM leaves no process behind; with `--shard patroni` the shard is a
Patroni cluster and consumers log in through its pgBouncer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import kubernetes
import psycopg
import pytest
import requests
from psycopg.conninfo import make_conninfo

from domain.constants import GROUP, PLURAL_SHARDS, VERSION
from tests.support.common import wait_for
from tests.support.dev_command import api_session, read_env_file, start_dev, stop_dev, wait_ready_line
from tests.support.documented import run_documented_against_dev


def put_until_ready(session: requests.Session, base: str, name: str) -> dict[str, str]:
    """PUT a small database, wait until it is Ready; its credentials."""
    created = session.put(f"{base}/{name}", json={"sizeClass": "small"}, timeout=10)
    assert created.status_code == 201, created.text
    wait_for(lambda: session.get(f"{base}/{name}", timeout=10).json().get("phase") == "Ready", 90, f"{name} Ready")
    credentials: dict[str, str] = session.get(f"{base}/{name}/credentials", timeout=10).json()
    return credentials


@pytest.mark.server  # `dbprovider dev` starts an apiserver and a PostgreSQL server
def test_dev_runs_the_consumer_flow_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = start_dev(state, "--postgres", "16")
    try:
        text = wait_ready_line(proc, 180)
        assert "dbprovider dev: ready" in text, text
        env_file = state / "env"
        assert env_file.stat().st_mode & 0o777 == 0o600
        env = read_env_file(env_file)
        assert set(env) == {"KUBECONFIG", "DBPROVIDER_API_URL", "DBPROVIDER_CA_FILE", "DBPROVIDER_TOKEN"}
        assert "curl" in text and env["DBPROVIDER_TOKEN"] in text  # the walkthrough prints the token

        session = api_session(env)
        base = f"{env['DBPROVIDER_API_URL']}/v1/databases"
        credentials = put_until_ready(session, base, "orders")
        with psycopg.connect(credentials["uri"]) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == credentials["user"]
        for elsewhere in ("postgres", "template1"):  # dev's shard is prepared as docs/sql.md says
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                psycopg.connect(make_conninfo(credentials["uri"], dbname=elsewhere))

        api = kubernetes.config.new_client_from_config(config_file=env["KUBECONFIG"])
        with api:
            objects = kubernetes.client.CustomObjectsApi(api)

            def shard_capacity() -> tuple[int | None, int | None, int | None, int]:
                """(databaseCount, connectionsCommitted, databasesAvailable, maxDatabases) of dev's shard."""
                shard = objects.list_cluster_custom_object(GROUP, VERSION, PLURAL_SHARDS)["items"][0]
                status = shard["status"]
                keys = ("databaseCount", "connectionsCommitted", "databasesAvailable")
                count, committed, available = (status.get(key) for key in keys)
                return count, committed, available, shard["spec"]["maxDatabases"]

            # The count is written a second after the change. The shard holds what its MAX says: after one
            # small database (5 connections), MAX - 1 more of the default limit fit its budget.
            maximum = shard_capacity()[3]
            wait_for(lambda: shard_capacity()[:3] == (1, 5, maximum - 1), 30, "the shard to count the database")
            assert maximum == 100
            # What the README and docs/api.md show a reader, run as written in a second shell (it ends by
            # deleting the database).
            workdir = tmp_path / "reader"
            workdir.mkdir()
            run_documented_against_dev(state, workdir)
            # A deleted (disabled) database keeps its slot until it is dropped, but commits no connections.
            assert session.delete(f"{base}/orders", timeout=10).status_code == 202
            wait_for(lambda: shard_capacity()[:3] == (1, 0, maximum - 1), 30, "the disabled tenant to commit nothing")

        stop_dev(proc, env_file)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.server  # `dbprovider dev` starts an apiserver, a Patroni cluster and pgBouncer
def test_dev_with_a_patroni_shard_hands_out_pgbouncer(tmp_path: Path) -> None:
    """The Shard's client endpoint is pgBouncer: the credentials name it, and the psql line dev prints
    logs in through it to the tenant database on the Patroni primary."""
    state = tmp_path / "state"
    proc = start_dev(state, "--shard", "patroni")
    try:
        text = wait_ready_line(proc, 240)
        assert "dbprovider dev: ready" in text, text
        pgbouncer = re.search(r"pgBouncer 127\.0\.0\.1:(\d+)", text)
        assert pgbouncer is not None, text
        env_file = state / "env"
        env = read_env_file(env_file)
        session = api_session(env)
        base = f"{env['DBPROVIDER_API_URL']}/v1/databases"
        credentials = put_until_ready(session, base, "orders")
        assert int(credentials["port"]) == int(pgbouncer.group(1))

        printed = next(line.strip() for line in text.splitlines() if line.strip().startswith("psql "))
        result = subprocess.run(
            ["bash", "-c", f"source {env_file}; {printed}"],
            input="SELECT current_user || ' on ' || inet_server_port();\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        # Through pgBouncer: the session's server is a Patroni member, on a port other than the one dialled.
        served = re.search(rf"{re.escape(credentials['user'])} on (\d+)", result.stdout)
        assert served is not None, result.stdout
        assert int(served.group(1)) != int(credentials["port"])
        stop_dev(proc, env_file)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
