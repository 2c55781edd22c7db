"""Shard faults: PostgreSQL killed mid-burst and restarted on its data directory; its postmaster
paused (no new connections, old sessions still answer); postmaster and every backend paused."""

from __future__ import annotations

import os
import signal

from tests.faults.support import SHARD_A, SHARD_B, FaultStack, check_invariants, record, timed, wait_for


def _no_failed(stack: FaultStack, names: list[str]) -> bool:
    """A shard outage is transient: no database may be reported Failed meanwhile."""
    phases = stack.phases(names)
    assert phases["Failed"] == 0, f"a shard outage showed databases as Failed: {phases}"
    return True


def test_shard_sigkill_mid_burst_and_restart(owned: FaultStack) -> None:
    fault = "shard PostgreSQL SIGKILL + restart"
    stack = owned
    replica, names = stack.leading_burst("pgkill", 12)
    server = stack.shards[SHARD_A]
    server.crash()  # postmaster and every backend, mid-burst
    try:
        detect = timed(lambda: not stack.shard_ready(SHARD_A), 60, "NotReady")
        record(fault, "shard Ready=False after the kill", detect)
        assert stack.shard_reason(SHARD_A) == "Unreachable"
        # The burst goes on: new databases land on the other shard meanwhile.
        during = stack.burst(replica, "pgkill-during", 4)
        wait_for(lambda: stack.phases(during)["Ready"] == len(during), 90, "databases placed during the outage")
        _no_failed(stack, names + during)
    finally:
        server.restart()  # crash recovery on the same data directory and port
    record(fault, "shard Ready after the restart", timed(lambda: stack.shard_ready(SHARD_A), 60, "Ready again"))
    record(fault, "every database Ready after the restart", check_invariants(stack, fault))


def _paused_shard(stack: FaultStack, fault: str, prefix: str, stop: str) -> None:
    """Pause shard A (`stop`: "postmaster" or "all"), prove it is noticed and avoided, resume."""
    replica, before = stack.leading_burst(prefix, 6)
    wait_for(lambda: stack.phases(before)["Ready"] == len(before), 90, "the first databases Ready")
    server = stack.shards[SHARD_A]
    pid = server.pid
    assert pid is not None
    if stop == "postmaster":
        os.kill(pid, signal.SIGSTOP)  # old sessions still answer; no new connection gets through
    else:
        os.killpg(pid, signal.SIGSTOP)  # the postmaster and every backend
    try:
        detect = timed(lambda: not stack.shard_ready(SHARD_A), 60, "NotReady")
        record(fault, "shard Ready=False after the pause", detect)
        during = stack.burst(replica, f"{prefix}-during", 6)
        ready = wait_for(
            lambda: (dbs := stack.databases()) and all(
                (dbs.get(n) or {}).get("status", {}).get("phase") == "Ready" for n in during
            ) and dbs,
            90, "databases created during the pause Ready",
        )
        # Reported Ready only where a consumer can connect: on the shard that accepts connections.
        assert {ready[n]["status"]["shard"] for n in during} == {SHARD_B}
        _no_failed(stack, before + during)
    finally:
        if stop == "postmaster":
            os.kill(pid, signal.SIGCONT)
        else:
            os.killpg(pid, signal.SIGCONT)
    record(fault, "shard Ready after the resume", timed(lambda: stack.shard_ready(SHARD_A), 60, "Ready again"))
    record(fault, "every database Ready after the resume", check_invariants(stack, fault))


def test_postmaster_sigstop(owned: FaultStack) -> None:
    _paused_shard(owned, "shard postmaster SIGSTOP", "pmstop", "postmaster")


def test_postmaster_and_backends_sigstop(owned: FaultStack) -> None:
    _paused_shard(owned, "shard postmaster + backends SIGSTOP", "allstop", "all")
