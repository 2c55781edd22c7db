"""Shard faults: PostgreSQL killed mid-burst and restarted on its data directory; its postmaster
paused (no new connections, old sessions still answer); postmaster and every backend paused (by PID:
backends call setsid(), so a signal to the process group reaches none of them), also mid-burst with
the other shard beside it; a shard that turns read-only; a shard link with latency and resets."""

from __future__ import annotations

import os
import signal
import time

from domain.resources import SHARDS
from harness.tcp_proxy import TcpProxy
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
        assert len(server.process_ids()) > 2
        server.freeze()  # the postmaster and every backend, by PID
    try:
        detect = timed(lambda: not stack.shard_ready(SHARD_A), 60, "NotReady")
        record(fault, "shard Ready=False after the pause", detect)
        during = stack.burst(replica, f"{prefix}-during", 6)
        ready = wait_for(
            lambda: (
                (dbs := stack.databases())
                and all((dbs.get(n) or {}).get("status", {}).get("phase") == "Ready" for n in during)
                and dbs
            ),
            90,
            "databases created during the pause Ready",
        )
        # Reported Ready only where a consumer can connect: on the shard that accepts connections.
        assert {ready[n]["status"]["shard"] for n in during} == {SHARD_B}
        _no_failed(stack, before + during)
    finally:
        if stop == "postmaster":
            os.kill(pid, signal.SIGCONT)
        else:
            server.thaw()
    record(fault, "shard Ready after the resume", timed(lambda: stack.shard_ready(SHARD_A), 60, "Ready again"))
    record(fault, "every database Ready after the resume", check_invariants(stack, fault))


def test_postmaster_sigstop(owned: FaultStack) -> None:
    _paused_shard(owned, "shard postmaster SIGSTOP", "pmstop", "postmaster")


def test_postmaster_and_backends_sigstop(owned: FaultStack) -> None:
    _paused_shard(owned, "shard postmaster + backends SIGSTOP", "allstop", "all")


def _phase_reason(stack: FaultStack, names: list[str]) -> dict[str, tuple[str, str | None]]:
    dbs = stack.databases()
    found = {}
    for name in names:
        status = (dbs.get(name) or {}).get("status") or {}
        reason = next((c["reason"] for c in status.get("conditions") or [] if c["type"] == "Ready"), None)
        found[name] = (status.get("phase") or "absent", reason)
    return found


def test_hung_shard_mid_burst_with_a_healthy_one_beside_it(owned: FaultStack) -> None:
    """Every process of shard A stopped while a burst is provisioned on both shards: B's share of
    the burst, and new databases, are Ready meanwhile; A's work is abandoned within the check bounds
    and waits (Provisioning, ShardNotReady); after the resume everything converges."""
    fault = "hung shard mid-burst, healthy one beside"
    stack = owned
    replica, names = stack.leading_burst("hung", 8)
    wait_for(lambda: stack.phases(names)["Ready"] >= 1, 60, "the burst under way")
    server = stack.shards[SHARD_A]
    assert len(server.process_ids()) > 2
    server.freeze()
    hung = time.monotonic()
    try:
        # The rest of the burst comes while A hangs and still counts as Ready (its check has not run out
        # yet): some of it is placed on A and cannot finish. On a quiet machine the first part may all be
        # Ready before the freeze (CI once found nothing of A's left to wait).
        names += stack.burst(replica, "hung-rest", 8)

        def b_ready() -> bool:
            dbs = stack.databases()
            on_b = [n for n in names if ((dbs.get(n) or {}).get("status") or {}).get("shard") == SHARD_B]
            return all(phase == "Ready" for phase, _ in _phase_reason(stack, on_b).values())

        record(fault, "B's share of the burst Ready after the hang", timed(b_ready, 90, "B's databases Ready"))
        wait_for(lambda: not stack.shard_ready(SHARD_A), 60, "A not Ready")
        record(fault, "shard A Ready=False, from the hang", time.monotonic() - hung)
        during = stack.burst(replica, "hung-during", 4)  # placed on B: A is not Ready
        record(
            fault,
            "4 new databases Ready (on B)",
            timed(lambda: stack.phases(during)["Ready"] == len(during), 90, "new databases Ready"),
        )
        assert {stack.databases()[n]["status"]["shard"] for n in during} == {SHARD_B}

        def waiting() -> bool:
            rows = _phase_reason(stack, names)
            pending = [row for row in rows.values() if row[0] != "Ready"]
            return bool(pending) and all(row == ("Provisioning", "ShardNotReady") for row in pending)

        wait_for(waiting, 60, "A's unfinished databases Provisioning/ShardNotReady")
        record(fault, "A's databases wait (ShardNotReady), from the hang", time.monotonic() - hung)
        assert stack.shard_reason(SHARD_A) == "Unreachable"
        _no_failed(stack, names + during)
    finally:
        server.thaw()
    resumed = time.monotonic()
    record(fault, "shard Ready after the resume", timed(lambda: stack.shard_ready(SHARD_A), 60, "Ready again"))
    check_invariants(stack, fault)
    record(fault, "every database Ready after the resume", time.monotonic() - resumed)


def test_read_only_shard(owned: FaultStack) -> None:
    """Shard A's new sessions turn read-only (default_transaction_read_only) during a burst and deletes:
    A is not Ready (ReadOnly), gets no placements, its drops wait; all converges once it writes again."""
    fault = "read-only shard"
    stack = owned
    replica, before = stack.leading_burst("rdonly", 8)
    wait_for(lambda: stack.phases(before)["Ready"] == len(before), 90, "the first databases Ready")
    server = stack.shards[SHARD_A]
    on_a = [n for n, db in stack.databases().items() if n in before and db["status"].get("shard") == SHARD_A]
    assert on_a

    def read_only(on: bool) -> None:
        with server.superuser_connection() as su:
            su.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
            su.execute("SELECT pg_reload_conf()")

    read_only(True)
    changed = time.monotonic()
    try:
        record(
            fault,
            "shard ReadOnly after the change",
            timed(lambda: stack.shard_reason(SHARD_A) == "ReadOnly", 60, "ReadOnly"),
        )
        for name in on_a:
            stack.delete(replica, name)
        during = stack.burst(replica, "rdonly-during", 6)
        wait_for(lambda: stack.phases(during)["Ready"] == len(during), 90, "databases created meanwhile Ready")
        assert {stack.databases()[n]["status"]["shard"] for n in during} == {SHARD_B}
        wait_for(
            lambda: all(row == ("Deleting", "ShardNotReady") for row in _phase_reason(stack, on_a).values()),
            60,
            "the deletes on A waiting",
        )
        _no_failed(stack, before + during)
        record(fault, "time the shard stayed read-only", time.monotonic() - changed)
    finally:
        read_only(False)
    record(fault, "shard Ready after it writes again", timed(lambda: stack.shard_ready(SHARD_A), 60, "Ready"))
    record(fault, "every database converged after that", check_invariants(stack, fault))


def test_shard_link_with_latency_and_resets(owned: FaultStack) -> None:
    """Shard B reached through a link with 200 ms of round trip and a connection reset every ~2 s
    (admin and client endpoint): it stays usable, provisioning and drops converge, and once the link
    is clean again the remaining work is done within a minute."""
    fault = "shard link 200 ms + resets"
    stack = owned
    server = stack.shards[SHARD_B]
    with TcpProxy("127.0.0.1", server.port) as proxy:
        original = stack.rest.get(SHARDS, SHARD_B)["spec"]
        link = {"admin": {"port": proxy.port}, "client": {"port": proxy.port}}
        stack.rest.patch(SHARDS, SHARD_B, {"spec": link})
        try:
            proxy.set_latency(0.2)
            proxy.set_resets(2.0)
            # Only B takes new databases meanwhile: A stops accepting.
            stack.rest.patch(SHARDS, SHARD_A, {"spec": {"accepting": False}})
            replica, names = stack.leading_burst("flaky", 8)
            record(
                fault,
                "burst of 8 Ready through the flaky link",
                timed(lambda: stack.phases(names)["Ready"] == len(names), 240, "the burst Ready"),
            )
            for name in names[:4]:
                stack.delete(replica, name)
            record(
                fault,
                "4 drops done through the flaky link",
                timed(lambda: stack.phases(names[:4])["absent"] == 4, 240, "the drops done"),
            )
            assert proxy.resets > 0
            late = stack.burst(replica, "flaky-late", 3)
            time.sleep(5)
            proxy.set_resets(None)
            cleaned = time.monotonic()
            wait_for(lambda: stack.phases(late)["Ready"] == len(late), 60, "work done once the link is clean")
            record(fault, "remaining work done after the link is clean", time.monotonic() - cleaned)
        finally:
            stack.rest.patch(SHARDS, SHARD_A, {"spec": {"accepting": True}})
            restore = {"admin": {"port": original["admin"]["port"]}, "client": {"port": original["client"]["port"]}}
            stack.rest.patch(SHARDS, SHARD_B, {"spec": restore})
    check_invariants(stack, fault)
