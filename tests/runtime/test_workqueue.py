"""The work queue alone (no apiserver): dedup, one worker per key, delays, backoff, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from reconciler.runtime import ExponentialBackoff, WorkQueue
from tests.support.common import wait_for

# -- dedup and exclusivity ---------------------------------------------------------------------------


def nothing_to_hand_out(queue: WorkQueue) -> bool:
    """No key ready and none delayed: `get` would block (read from the queue's state, not by waiting)."""
    return len(queue) == 0 and queue.pending() == 0


def test_a_key_added_many_times_is_handed_out_once() -> None:
    queue = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert queue.get(timeout=1) == "a"
    assert queue.get(timeout=1) == "b"
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.05)


def test_a_key_in_process_is_not_handed_out_again_but_requeued_after_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(timeout=1) == "a"
    queue.add("a")
    queue.add("a")
    assert nothing_to_hand_out(queue)  # "a" is being processed: no second worker gets it
    queue.done("a")
    assert queue.get(timeout=1) == "a"  # added meanwhile: exactly once more
    queue.done("a")
    assert nothing_to_hand_out(queue)


def test_done_without_new_adds_does_not_requeue() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(timeout=1) == "a"
    queue.done("a")
    assert len(queue) == 0


def test_blocked_getters_are_woken_by_add() -> None:
    queue = WorkQueue()
    got: list[str | None] = []
    thread = threading.Thread(target=lambda: got.append(queue.get(timeout=5)))
    thread.start()
    queue.add("x")
    thread.join(5)
    assert got == ["x"]


# -- delays and backoff ------------------------------------------------------------------------------


def test_add_after_delays_and_the_earliest_delay_wins() -> None:
    queue = WorkQueue()
    start = time.monotonic()
    queue.add_after("a", 5.0)
    queue.add_after("a", 0.1)  # earlier: replaces
    queue.add_after("a", 3.0)  # later: ignored
    assert queue.pending() == 1
    assert queue.get(timeout=2) == "a"
    elapsed = time.monotonic() - start
    assert 0.1 <= elapsed < 1.0
    queue.done("a")
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.2)  # the 3 s and 5 s entries are gone


def test_add_after_of_a_queued_key_does_not_duplicate_it() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add_after("a", 0.05)
    assert queue.get(timeout=1) == "a"
    queue.done("a")
    assert queue.get(timeout=1) == "a"  # the delayed add fires once
    queue.done("a")
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.1)


def _take_one(queue: WorkQueue, got: list[str | None]) -> threading.Thread:
    """An idle worker that takes one key and then stays busy with it (never calls get again)."""
    thread = threading.Thread(target=lambda: got.append(queue.get()), daemon=True)
    thread.start()
    return thread


def test_delayed_keys_reach_idle_workers_while_the_one_that_kept_time_is_busy() -> None:
    """One idle worker waits for the next delayed key, the others until a key is ready; when it takes a
    key, another one keeps the time: no delayed key waits for a busy worker to come back."""
    queue = WorkQueue()
    got: list[str | None] = []
    workers = [_take_one(queue, got) for _ in range(3)]
    wait_for(lambda: all(w.is_alive() for w in workers))
    for i, delay in enumerate((0.05, 0.1, 0.15)):
        queue.add_after(f"k{i}", delay)

    wait_for(lambda: len(got) == 3, timeout=10, what="every delayed key handed out")
    assert sorted(got) == ["k0", "k1", "k2"]  # type: ignore[type-var]


def test_a_key_due_sooner_wakes_the_worker_waiting_for_a_later_one() -> None:
    queue = WorkQueue()
    got: list[str | None] = []
    queue.add_after("in-an-hour", 3600)
    worker = _take_one(queue, got)
    wait_for(worker.is_alive)
    queue.add_after("soon", 0.05)

    wait_for(lambda: got == ["soon"], timeout=10, what="the sooner key handed out (not after the hour)")
    queue.shutdown()


def test_backoff_doubles_from_one_second_up_to_five_minutes_and_forget_resets() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("a") for _ in range(12)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert backoff.when("b") == 1  # per key
    assert backoff.failures("a") == 12
    backoff.forget("a")
    assert backoff.failures("a") == 0
    assert backoff.when("a") == 1


def test_add_rate_limited_uses_the_keys_backoff() -> None:
    queue = WorkQueue(ExponentialBackoff(base=0.05, max_delay=0.2))
    delays = []
    for _ in range(4):
        start = time.monotonic()
        delays.append(queue.add_rate_limited("a"))
        assert queue.get(timeout=2) == "a"
        assert time.monotonic() - start >= delays[-1] * 0.9
        queue.done("a")
    assert delays == [0.05, 0.1, 0.2, 0.2]
    assert queue.num_requeues("a") == 4
    queue.forget("a")
    assert queue.num_requeues("a") == 0


# -- shutdown ----------------------------------------------------------------------------------------


def test_shutdown_wakes_all_getters_and_drops_queued_and_delayed_keys() -> None:
    queue = WorkQueue()
    results: list[str | None] = []
    threads = [threading.Thread(target=lambda: results.append(queue.get())) for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(t.is_alive() for t in threads))
    queue.add_after("later", 0.5)
    queue.shutdown()
    for thread in threads:
        thread.join(5)
    assert results == [None, None, None]
    queue.add("a")
    assert queue.get() is None
    assert queue.shutting_down and len(queue) == 0 and queue.pending() == 0


def test_many_workers_never_share_a_key() -> None:
    queue = WorkQueue()
    active: set[str] = set()
    overlaps: list[str] = []
    processed: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while (key := queue.get()) is not None:
            with lock:
                if key in active:
                    overlaps.append(key)
                active.add(key)
            time.sleep(0.001)
            with lock:
                active.discard(key)
                processed.append(key)
            queue.done(key)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for i in range(2000):
        queue.add(f"k{i % 5}")
    wait_for(lambda: len(queue) == 0 and queue.processing() == 0, timeout=10)
    queue.shutdown()
    for thread in threads:
        thread.join(5)
    assert overlaps == []
    assert set(processed) == {f"k{i}" for i in range(5)}
    assert len(processed) < 2000  # deduplicated
