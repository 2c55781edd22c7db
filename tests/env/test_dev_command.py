"""`dbprovider dev` runs the whole product: a consumer goes from PUT to a working database, using only
the env file it writes, and SIGTERM leaves no process behind."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import kubernetes
import psutil
import psycopg
import pytest
import requests
from psycopg.conninfo import make_conninfo

from domain.constants import GROUP, PLURAL_SHARDS, VERSION
from tests.support.common import wait_for
from tests.support.dev_command import read_env_file, wait_ready_line
from tests.support.documented import run_documented_against_dev


@pytest.mark.server  # `dbprovider dev` starts an apiserver and a PostgreSQL server
def test_dev_runs_the_consumer_flow_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dbprovider.cli", "dev", "--state-dir", str(state), "--postgres", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps every thread's stack
    )
    try:
        text = wait_ready_line(proc, 180)
        assert "dbprovider dev: ready" in text, text
        env_file = state / "env"
        assert env_file.stat().st_mode & 0o777 == 0o600
        env = read_env_file(env_file)
        assert set(env) == {"KUBECONFIG", "DBPROVIDER_API_URL", "DBPROVIDER_CA_FILE", "DBPROVIDER_TOKEN"}
        assert "curl" in text and env["DBPROVIDER_TOKEN"] in text  # the walkthrough prints the token

        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {env['DBPROVIDER_TOKEN']}"
        # Per request: a session-level `verify` loses to REQUESTS_CA_BUNDLE in the environment.
        session.request = functools.partial(session.request, verify=env["DBPROVIDER_CA_FILE"])  # type: ignore[method-assign]
        base = f"{env['DBPROVIDER_API_URL']}/v1/databases"
        created = session.put(f"{base}/orders", json={"sizeClass": "small"}, timeout=10)
        assert created.status_code == 201, created.text
        wait_for(
            lambda: session.get(f"{base}/orders", timeout=10).json().get("phase") == "Ready", 60, "orders to be Ready"
        )
        credentials = session.get(f"{base}/orders/credentials", timeout=10).json()
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

        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the stack runs as children of dbprovider dev"
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # where each thread is, for the failure message
            try:
                rest, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                rest, _ = proc.communicate()
            raise AssertionError(f"dbprovider dev did not stop within 150s; its output:\n{rest}") from None
        assert proc.returncode == 0, rest
        assert "dbprovider dev: stopped" in rest
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"left behind: {[p.pid for p in alive]}"
        assert not env_file.exists()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
