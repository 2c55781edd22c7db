"""Running `dbprovider dev`: starting it, its ready line, the env file it writes and an API session from it,
and stopping it with nothing left behind (env and cli suites)."""

from __future__ import annotations

import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]


def start_dev(state: Path, *args: str) -> subprocess.Popen[str]:
    """`dbprovider dev --state-dir STATE ARGS...`, its output (stdout and stderr) on a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "dbprovider.cli", "dev", "--state-dir", str(state), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps every thread's stack
    )


def api_session(env: dict[str, str]) -> requests.Session:
    """A session to the consumer API with the env file's token and CA."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {env['DBPROVIDER_TOKEN']}"
    # Per request: a session-level `verify` loses to REQUESTS_CA_BUNDLE in the environment.
    session.request = functools.partial(session.request, verify=env["DBPROVIDER_CA_FILE"])  # type: ignore[method-assign]
    return session


def stop_dev(proc: subprocess.Popen[str], env_file: Path) -> None:
    """SIGTERM; asserts that it stops cleanly within 150 s, every process it started is gone and the env
    file with the token removed."""
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


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of the env file (`export KEY=value` lines, shell-quoted)."""
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = shlex.split(value)[0]
    return values


def wait_ready_line(proc: subprocess.Popen, timeout: float) -> str:
    """Its output up to the line that says the stack is up (or up to `timeout`/its end)."""
    output = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output.append(line)
        if "Ctrl-C stops everything" in line:
            break
    return "".join(output)
