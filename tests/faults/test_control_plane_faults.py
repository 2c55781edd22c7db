"""Control-plane faults: kube-apiserver paused 30 s and etcd killed and restarted, each while a
burst of new databases is being provisioned by the only manager."""

from __future__ import annotations

import os
import signal
import time

from tests.faults.support import FaultStack, check_invariants, record, timed

APISERVER_PAUSE = 30.0
PROMPT = 1.5  # seconds: every write is answered within the API's 1 s budget (plus the HTTP round trip)


def test_apiserver_sigstop_30s(owned: FaultStack) -> None:
    fault = "kube-apiserver SIGSTOP 30 s"
    stack = owned
    replica, names = stack.leading_burst("apistop", 10)
    pid = stack.kube.apiserver_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        # At once, before the replica knows the apiserver is gone: writes are bounded by the budget.
        for method, path in (("PUT", "/v1/databases/apistop-first"), ("DELETE", f"/v1/databases/{names[0]}")):
            started = time.monotonic()
            answer = replica.call(method, path, json={"sizeClass": "small"} if method == "PUT" else None)
            latency = time.monotonic() - started
            assert answer.status_code == 503, f"{method}: {answer.status_code} {answer.text}"
            assert latency < PROMPT, f"the {method} took {latency:.1f}s"
            record(fault, f"{method} in the first second answered 503 within", latency)
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
    stack.put(replica, "apistop-first")  # answered 503 (it may have been applied after the resume)
    stack.delete(replica, names[0])  # likewise: the client's retry of its DELETE
    record(fault, "every database Ready after the resume", check_invariants(stack, fault))


def test_etcd_restart(owned: FaultStack) -> None:
    fault = "etcd SIGKILL + restart"
    stack = owned
    replica, _ = stack.leading_burst("etcd", 10)
    started = time.monotonic()
    stack.kube.restart_etcd(down_for=5.0)
    record(fault, "/readyz 200 after etcd is back", timed(lambda: replica.readyz() == 200, 60, "/readyz 200"))
    # The apiserver may still need a moment for etcd: a write it does not answer within the API's
    # 1 s budget is a 503, and the client tries again (PUT is idempotent).
    record(fault, "a PUT accepted after etcd is back", stack.put_until_accepted(replica, "etcd-after"))
    record(fault, "every database Ready after the restart", check_invariants(stack, fault))
    record(fault, "whole fault, kill to converged", time.monotonic() - started)
