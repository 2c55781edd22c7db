"""Wakeups: the keys a controller's own collaborators ask a pass for, made before the controller itself."""

from __future__ import annotations

import threading

import pytest

from reconciler.runtime import Controller, Result, Wakeups
from tests.support.common import wait_for


def test_a_key_sent_through_wakeups_gets_a_pass_while_its_controller_runs() -> None:
    wakeups = Wakeups()
    passes: list[str] = []
    lock = threading.Lock()

    def reconcile(key: str) -> Result:
        with lock:
            passes.append(key)
        return Result()

    wakeups.enqueue("before")  # no controller takes it yet: dropped (a start resyncs every key)
    controller = Controller("woken", reconcile, wakeups=wakeups)
    wakeups.enqueue("stopped")  # not running: dropped, as the controller's own enqueue drops it
    controller.start()
    try:
        wakeups.enqueue("shard-a")
        wait_for(lambda: "shard-a" in passes, timeout=10, what="the woken key's pass")
    finally:
        controller.stop(timeout=10)
    assert passes == ["shard-a"]


def test_wakeups_go_to_one_controller() -> None:
    wakeups = Wakeups()
    Controller("first", lambda key: None, wakeups=wakeups)
    with pytest.raises(ValueError, match="first"):
        Controller("second", lambda key: None, wakeups=wakeups)
