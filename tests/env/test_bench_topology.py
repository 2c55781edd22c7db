"""The benchmarks' `--shard-cpu` topology holds: a pinned PostgreSQL server stays on its CPU, the sessions
it starts later included, and the least time a phase's CPU allows is what the benchmarks print."""

from __future__ import annotations

import os
import subprocess

import pytest

from bench.common import ShardCpus, least_seconds, pin_to_cpus
from harness import PostgresServer

CPUS = os.sched_getaffinity(0)


@pytest.mark.server  # starts a PostgreSQL server of its own
def test_a_pinned_server_and_its_later_sessions_run_on_the_shard_cpu_only() -> None:
    pinned = ShardCpus.last_cpu()
    assert pinned.shard == {max(CPUS)} and pinned.rest == CPUS - {max(CPUS)}
    with PostgresServer("18") as server:
        pinned.pin_postgres(server)
        assert {frozenset(os.sched_getaffinity(pid)) for pid in server.process_ids()} == {frozenset(pinned.shard)}
        # A session opened afterwards: its backend is forked by the postmaster and inherits the pin.
        with server.superuser_connection() as conn:
            [(backend,)] = conn.execute("SELECT pg_backend_pid()").fetchall()
            assert os.sched_getaffinity(backend) == pinned.shard
    assert os.sched_getaffinity(0) == CPUS  # this process is left alone


def test_least_seconds_is_the_cpu_on_all_cores_or_the_busier_side_when_pinned() -> None:
    cpu = {"postgres": 8.0, "kube-apiserver": 3.0, "manager": 3.0}
    assert least_seconds(cpu, 2, None) == 7.0
    assert least_seconds(cpu, 2, ShardCpus({1}, {0})) == 8.0  # PostgreSQL alone on its one CPU
    assert least_seconds({"postgres": 2.0, "manager": 6.0}, 2, ShardCpus({1}, {0})) == 6.0


def test_pinning_a_process_that_has_ended_is_passed_over() -> None:
    """A backend whose session closed between listing the server's processes and pinning them (seen in a
    bench.fleet run): its PID is gone, and the pin goes on with the others instead of failing the run."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    pin_to_cpus(ended.pid, {min(CPUS)})  # no error
    assert os.sched_getaffinity(0) == CPUS
