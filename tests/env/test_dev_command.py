"""`dbprovider dev` brings the local stack up, prints how to reach it, and leaves nothing on SIGTERM."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubernetes
import psutil
import psycopg


def _read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = shlex.split(value)[0]
    return values


def test_dev_runs_the_local_stack_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dbprovider.cli", "dev", "--state-dir", str(state), "--postgres", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    output = []
    try:
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            output.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(output)
        assert "dbprovider dev: ready" in text, text
        env = _read_env_file(state / "env")
        assert env["DBPROVIDER_SHARD_PASSWORD"] not in text  # printed nowhere, only in the 0600 file
        assert (state / "env").stat().st_mode & 0o777 == 0o600

        api = kubernetes.config.new_client_from_config(config_file=env["KUBECONFIG"])
        with api:
            names = [ns.metadata.name for ns in kubernetes.client.CoreV1Api(api).list_namespace().items]
        assert "dbprovider" in names
        with psycopg.connect(
            host=env["DBPROVIDER_SHARD_HOST"], port=int(env["DBPROVIDER_SHARD_PORT"]),
            user=env["DBPROVIDER_SHARD_USER"], password=env["DBPROVIDER_SHARD_PASSWORD"], dbname="postgres",
        ) as conn:
            assert conn.execute("SHOW server_version_num").fetchone()[0].startswith("16")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the stack runs as children of dbprovider dev"

        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "dbprovider dev: stopped" in rest
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left behind: {[p.pid for p in alive]}"
        assert not (state / "env").exists()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
