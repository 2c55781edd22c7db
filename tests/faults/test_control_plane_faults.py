"""Control-plane faults: kube-apiserver paused 30 s and etcd killed and restarted, each while a
burst of new databases is being provisioned by the only manager."""

from __future__ import annotations

import os
import signal
import time

from tests.faults.support import FaultStack, check_invariants, record, timed

APISERVER_PAUSE = 30.0
PROMPT = 6.0  # seconds: a write must be answered (503) well before a client gives up


def test_apiserver_sigstop_30s(owned: FaultStack) -> None:
    fault = "kube-apiserver SIGSTOP 30 s"
    stack = owned
    replica, _ = stack.leading_burst("apistop", 10)
    pid = stack.kube.apiserver_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        record(fault, "/readyz 503 after the pause", timed(lambda: replica.readyz() == 503, 20, "/readyz 503"))
        started = time.monotonic()
        answer = replica.call("PUT", "/v1/databases/apistop-during", json={"sizeClass": "small"})
        latency = time.monotonic() - started
        assert answer.status_code == 503, answer.text
        assert latency < PROMPT, f"the PUT took {latency:.1f}s"
        record(fault, "PUT answered 503 within", latency)
        time.sleep(max(0.0, APISERVER_PAUSE - (time.monotonic() - paused)))  # the fault lasts 30 s
    finally:
        os.kill(pid, signal.SIGCONT)
    record(fault, "/readyz 200 after the resume", timed(lambda: replica.readyz() == 200, 60, "/readyz 200"))
    stack.put(replica, "apistop-during")  # the client's retry: PUT is idempotent
    record(fault, "every database Ready after the resume", check_invariants(stack, fault))


def test_etcd_restart(owned: FaultStack) -> None:
    fault = "etcd SIGKILL + restart"
    stack = owned
    replica, _ = stack.leading_burst("etcd", 10)
    started = time.monotonic()
    stack.kube.restart_etcd(down_for=5.0)
    record(fault, "/readyz 200 after etcd is back", timed(lambda: replica.readyz() == 200, 60, "/readyz 200"))
    stack.put(replica, "etcd-after")
    record(fault, "every database Ready after the restart", check_invariants(stack, fault))
    record(fault, "whole fault, kill to converged", time.monotonic() - started)
