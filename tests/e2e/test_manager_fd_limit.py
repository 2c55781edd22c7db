"""`dbprovider manager` and its file descriptor limit (issue 25): the soft limit is raised to the hard
limit at start, and an api.maxConnections that leaves no room for watches, shard sessions and metrics
stops the manager at startup, naming the key."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from dbprovider.devstack import DevStack, free_port
from dbprovider.manager import FD_RESERVE
from harness import KubeControlPlane, PostgresServer
from informers import Rest
from reconciler.resources import CONSUMERS, SHARDS
from tests.support.common import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool, tmp_path_factory) -> Iterator[DevStack]:
    postgres: PostgresServer = postgres_pool.get("18")
    created = DevStack(
        kube, postgres, tmp_path_factory.mktemp("e2e-fd"),
        config_overrides={
            "releaseName": "e2efd", "namespace": "e2efd-system", "tls": {"secretName": "e2efd-tls"},
            "deletionProtection": {"enabled": False},
        },
        consumer="e2efd-consumer", shard="e2efd-pg",
    ).install()
    yield created
    with kube.admin_client() as client:
        rest = Rest(client)
        rest.delete(SHARDS, created.shard)
        rest.delete(CONSUMERS, created.consumer)


def start(stack: DevStack, log: Path, soft: int, hard: int) -> tuple[subprocess.Popen[bytes], int]:
    """A manager whose RLIMIT_NOFILE starts at (soft, hard), as a container runtime would set it."""
    limits: Callable[[], None] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # noqa: E731
    api_port = free_port()
    env = {**os.environ, **stack.manager_env(), "POD_NAME": log.stem}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            stack.manager_argv(sys.executable, api_port, free_port()), stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=REPO, preexec_fn=limits,
        )
    return process, api_port


def open_files_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open files limit")


def test_the_soft_limit_is_raised_to_the_hard_limit(stack: DevStack, tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    process, api_port = start(stack, tmp_path / "raised.log", 1024, hard)
    try:
        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "raised.log").read_text()
            try:
                url = f"https://127.0.0.1:{api_port}/healthz"
                return requests.get(url, verify=str(stack.ca_file), timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(ready, 60, "the manager to answer")
        assert open_files_limit(process.pid) == (str(hard), str(hard))
    finally:
        process.terminate()
        process.wait(60)


def test_max_connections_without_room_stops_the_manager(stack: DevStack, tmp_path: Path) -> None:
    limit = 1000 + FD_RESERVE - 1  # the default api.maxConnections (1000) does not fit
    process, _ = start(stack, tmp_path / "refused.log", limit, limit)
    try:
        assert process.wait(timeout=60) == 2
    finally:
        process.kill()
    log = (tmp_path / "refused.log").read_text()
    assert "api.maxConnections 1000 leaves no room" in log
    assert f"at most {limit - FD_RESERVE}" in log
