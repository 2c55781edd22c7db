"""Lanes of the work queue (no apiserver): a lane's limit, turns between lanes, keys that change lane,
numbered slots, and a hung lane that holds only its own workers. The queue's other contract (dedup,
one worker per key, delays, shutdown) is in test_workqueue.py and holds with lanes too."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from reconciler.runtime import Lanes, Slot, WorkQueue
from reconciler.runtime.workqueue import DEFAULT_LANE
from tests.support.common import wait_for


def lane_queue(lanes: dict[str, str], limit: int) -> WorkQueue:
    """A queue whose lane of a key is read from `lanes` (key -> lane) at every look, like the cache."""
    return WorkQueue(lanes=Lanes(lambda key: lanes.get(key, "unplaced"), limit))


def take(queue: WorkQueue, n: int) -> list[str]:
    return [queue.get(timeout=1) or "" for _ in range(n)]


def nothing_ready_for_a_worker(queue: WorkQueue) -> bool:
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.05)
    return True


def test_a_full_lane_waits_while_other_lanes_are_handed_out() -> None:
    lanes = {f"a{i}": "a" for i in range(5)} | {f"b{i}": "b" for i in range(2)}
    queue = lane_queue(lanes, limit=2)
    for key in lanes:  # lane a's keys first
        queue.add(key)

    assert sorted(take(queue, 4)) == ["a0", "a1", "b0", "b1"]  # two of lane a, then b's keys
    assert nothing_ready_for_a_worker(queue)  # both lanes full: the rest of a waits
    assert queue.lane_stats() == {"a": (3, 2), "b": (0, 2)}  # (ready, in flight)
    queue.done("b0")
    assert nothing_ready_for_a_worker(queue)  # b's free slot is b's, not a's
    queue.done("a0")
    assert queue.get(timeout=1) == "a2"  # a slot of lane a came free


def test_lanes_take_turns_so_a_burst_delays_another_lane_by_one_key_per_busy_lane() -> None:
    lanes = {f"a{i:03d}": "a" for i in range(1000)} | {f"b{i}": "b" for i in range(3)} | {"c0": "c"}
    queue = lane_queue(lanes, limit=1000)
    for key in lanes:  # lane a's 1,000 keys first
        queue.add(key)

    order = take(queue, 9)
    assert order == ["a000", "b0", "c0", "a001", "b1", "a002", "b2", "a003", "a004"]


def test_a_key_is_handed_out_in_the_lane_it_has_when_a_worker_takes_it() -> None:
    lanes = {"s1-x": "s1", "s1-y": "s1", "other": "s2"}
    queue = lane_queue(lanes, limit=2)
    queue.add("new")  # not placed yet: the unplaced lane
    queue.add("s1-x")
    queue.add("s1-y")
    assert take(queue, 2) == ["new", "s1-x"]
    assert queue.slot("new") == Slot("unplaced", 0)
    lanes["new"] = "s1"  # placed on s1 while its pass runs: its next pass belongs to s1's lane
    queue.add("new")
    queue.done("new")
    assert queue.get(timeout=1) == "s1-y"
    assert queue.lane_stats() == {"s1": (1, 2)}  # "new" waits in s1's lane, s1 is full
    assert nothing_ready_for_a_worker(queue)

    # A key that changed lane while it waited (its placement event had not come yet) moves on hand-out.
    queue.add("late")
    lanes["late"] = "s1"
    queue.add("other")
    assert queue.get(timeout=1) == "other"  # "late" was moved to s1's lane, which is full
    queue.done("s1-x")
    assert take(queue, 1) == ["new"]
    assert queue.slot("new") == Slot("s1", 0)  # the slot s1-x gave back
    queue.done("s1-y")
    assert queue.get(timeout=1) == "late"
    late = queue.slot("late")
    assert late is not None and late.lane == "s1"


def test_slots_are_numbered_within_a_lane_and_reused() -> None:
    lanes = {f"a{i}": "a" for i in range(4)} | {"b0": "b"}
    queue = lane_queue(lanes, limit=3)
    for key in lanes:
        queue.add(key)
    keys = take(queue, 4)
    slots = {key: queue.slot(key) for key in keys}
    assert slots == {"a0": Slot("a", 0), "b0": Slot("b", 0), "a1": Slot("a", 1), "a2": Slot("a", 2)}
    queue.done("a1")
    assert queue.slot("a1") is None
    assert queue.get(timeout=1) == "a3"
    assert queue.slot("a3") == Slot("a", 1)


def test_without_lanes_every_key_is_in_one_lane_without_a_limit() -> None:
    queue = WorkQueue()
    for i in range(50):
        queue.add(f"k{i}")
    keys = take(queue, 50)
    assert keys == [f"k{i}" for i in range(50)]  # FIFO, as before lanes
    slots = [queue.slot(k) for k in keys]
    assert {s.lane for s in slots if s is not None} == {DEFAULT_LANE}
    assert len({s.index for s in slots if s is not None}) == 50


def test_a_lane_function_that_fails_puts_the_key_in_the_default_lane() -> None:
    def broken(key: str) -> str:
        raise KeyError(key)

    queue = WorkQueue(lanes=Lanes(broken, 1))
    queue.add("a")
    assert queue.get(timeout=1) == "a"
    assert queue.slot("a") == Slot(DEFAULT_LANE, 0)


def test_a_hung_lane_holds_only_its_own_workers() -> None:
    """Eight workers (the global bound), two per lane: the hung shard's keys hold two workers, and
    the other lanes' keys, queued behind 20 of the hung shard's, all run meanwhile."""
    lanes = {f"hung{i}": "hung" for i in range(20)} | {f"ok{i}": f"s{i % 3}" for i in range(30)}
    queue = lane_queue(lanes, limit=2)
    release = threading.Event()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    done: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while (key := queue.get()) is not None:
            lane = lanes[key]
            with lock:
                running[lane] += 1
                peak[lane] = max(peak[lane], running[lane])
            if lane == "hung":
                release.wait(30)
            with lock:
                running[lane] -= 1
                done.append(key)
            queue.done(key)

    for key in lanes:  # the hung shard's keys first
        queue.add(key)
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: sum(k.startswith("ok") for k in done) == 30, timeout=10, what="every other lane's key")
        assert running["hung"] == 2 and not any(k.startswith("hung") for k in done)
        assert queue.lane_stats()["hung"] == (18, 2)
        release.set()
        wait_for(lambda: len(done) == 50, timeout=10, what="the hung lane's keys once it answers")
        assert peak["hung"] == 2 and max(peak[f"s{i}"] for i in range(3)) <= 2
    finally:
        release.set()
        queue.shutdown()
        for thread in threads:
            thread.join(5)


def test_a_released_slot_goes_to_the_lanes_next_key_while_the_released_key_stays_in_flight() -> None:
    lanes = {f"a{i}": "a" for i in range(3)}
    queue = lane_queue(lanes, limit=1)
    for key in lanes:
        queue.add(key)
    assert take(queue, 1) == ["a0"]
    assert nothing_ready_for_a_worker(queue)  # lane a is full

    queue.release("a0")  # a0's SQL is done; only its apiserver writes are left
    assert queue.slot("a0") is None
    assert queue.get(timeout=1) == "a1"  # the lane's next key starts at once
    assert queue.slot("a1") == Slot("a", 0)
    assert queue.lane_stats() == {"a": (1, 1)}  # a0 no longer counts against the lane

    queue.add("a0")  # an event of a0 while its pass still runs: not handed to a second worker
    assert nothing_ready_for_a_worker(queue)
    queue.release("a0")  # twice is a no-op
    queue.done("a0")  # its pass ends: queued again behind a2, a1's slot untouched
    assert queue.slot("a1") == Slot("a", 0)
    queue.done("a1")
    assert queue.get(timeout=1) == "a2"
    assert nothing_ready_for_a_worker(queue)  # a2 holds the lane's one slot; a0 waits for it
    queue.done("a2")
    assert queue.get(timeout=1) == "a0"
