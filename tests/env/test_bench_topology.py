"""The benchmarks' default topology (the shards on a CPU of their own) holds: a pinned PostgreSQL server stays
on its CPU, the sessions it starts later included; `--shared-cpus` and a one-CPU machine share every CPU;
and the least time a phase's CPU allows is what the benchmarks print."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from bench.common import ShardCpus, add_topology_option, least_seconds, pin_to_cpus, topology
from harness import PostgresServer

CPUS = os.sched_getaffinity(0)


@pytest.mark.server  # starts a PostgreSQL server of its own
def test_a_pinned_server_and_its_later_sessions_run_on_the_shard_cpu_only() -> None:
    pinned = ShardCpus.last_cpu()
    assert pinned is not None
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


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_topology_option(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(len(CPUS) < 2, reason="the shards apart need 2 CPUs; the one-CPU case is the next test's")
def test_the_shards_get_a_cpu_of_their_own_unless_shared_cpus_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    apart = topology(_parsed())
    assert apart == ShardCpus({max(CPUS)}, CPUS - {max(CPUS)})
    assert "PostgreSQL on CPU" in capsys.readouterr().out
    assert topology(_parsed("--shared-cpus")) is None
    assert "share every CPU (--shared-cpus)" in capsys.readouterr().out


def test_a_process_on_one_cpu_shares_it_and_says_so() -> None:
    """On a one-CPU machine the default cannot hold: the benchmark runs shared and prints why, not an error."""
    script = (
        "import argparse, os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from bench.common import add_topology_option, topology\n"
        "parser = argparse.ArgumentParser(); add_topology_option(parser)\n"
        "print(topology(parser.parse_args([])))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.splitlines() == [
        "topology: PostgreSQL and the control plane share every CPU (one CPU: the shards cannot have their own)",
        "None",
    ]
