"""Controllers on real informers: failures back off and are counted by reason, 409s are
conflicts (requeued, not errors), one key is never reconciled twice at once while different keys
run in parallel, requeue_after re-runs, and stop() lets in-flight reconciles finish."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from informers import CONFIGMAPS, Informer, Rest, split_key
from reconciler.runtime import (
    Controller,
    ControllerStopping,
    ExponentialBackoff,
    Lanes,
    ReconcileError,
    Result,
    RuntimeMetrics,
    TerminalError,
    WorkQueue,
    current_slot,
    ensure_active,
    release_slot,
)
from tests.runtime.support import configmap
from tests.support.common import wait_for

FAST = (0.05, 0.4)  # backoff base and cap for tests (production: 1 s and 5 min)


class Harness:
    """A started informer on one namespace and helpers to run controllers on it."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self.rest = rest
        self.namespace = namespace
        self.informer = Informer(rest, CONFIGMAPS, namespace).start()
        assert self.informer.wait_for_sync(10)
        self.metrics = RuntimeMetrics()
        self.controllers: list[Controller] = []

    def controller(
        self,
        name: str,
        reconcile: Callable[[str], Result | None],
        workers: int = 1,
        lanes: Lanes | None = None,
        settled: Callable[[str], bool] | None = None,
    ) -> Controller:
        queue = WorkQueue(ExponentialBackoff(*FAST), lanes)
        controller = Controller(name, reconcile, workers=workers, queue=queue, metrics=self.metrics, settled=settled)
        controller.watch(self.informer)
        self.controllers.append(controller)
        return controller

    def create(self, name: str, data: dict[str, str] | None = None) -> str:
        """Create a ConfigMap and wait until the informer has it (its event has been handled)."""
        self.rest.create(CONFIGMAPS, configmap(name, self.namespace, data or {"v": "0"}))
        key = f"{self.namespace}/{name}"
        wait_for(lambda: self.informer.get(key), what=f"the informer to see {key}")
        return key

    def errors(self, controller: str, reason: str, retryable: str | None = None) -> float:
        """dbprovider_reconcile_errors_total{controller, reason}, of one `retryable` value or both."""
        return sum(
            self.metrics.registry.get_sample_value(
                "dbprovider_reconcile_errors_total", {"controller": controller, "reason": reason, "retryable": value}
            )
            or 0.0
            for value in ((retryable,) if retryable else ("true", "false"))
        )

    def conflicts(self, controller: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "dbprovider_reconcile_conflicts_total", {"controller": controller}
        )
        return value or 0.0

    @staticmethod
    def busy(controller: Controller) -> bool:
        """Whether a key is queued, waiting for its backoff or being reconciled."""
        queue = controller.queue
        return bool(len(queue) or queue.pending() or queue.processing())

    def close(self) -> None:
        for controller in self.controllers:
            controller.stop(timeout=10)
        self.informer.stop()


@pytest.fixture
def env(admin_rest: Rest, namespace: str) -> Iterator[Harness]:
    harness = Harness(admin_rest, namespace)
    yield harness
    harness.close()


# -- failures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (lambda: ReconcileError("AdminUnavailable", "connection refused"), "AdminUnavailable"),
        (lambda: RuntimeError("boom"), "Other"),
        (lambda: ApiException(status=500, reason="Internal Server Error"), "Other"),
    ],
    ids=["reconcile-error", "exception", "api-500"],
)
def test_failures_back_off_exponentially_and_are_counted_by_reason(
    env: Harness, failure: Callable[[], Exception], reason: str
) -> None:
    attempts: list[float] = []

    def reconcile(key: str) -> Result:
        attempts.append(time.monotonic())
        if len(attempts) <= 3:
            raise failure()
        return Result()

    key = env.create("flaky")  # before the controller watches: its ADDED event is no extra trigger
    controller = env.controller("failing", reconcile)
    controller.start()
    wait_for(lambda: len(attempts) == 4, timeout=10, what="three failures and a success")

    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    for gap, expected in zip(gaps, (0.05, 0.1, 0.2), strict=True):
        assert gap >= expected * 0.9
    assert env.errors("failing", reason) == 3
    assert env.conflicts("failing") == 0
    assert controller.queue.num_requeues(key) == 0  # success forgot the backoff
    # Nothing queued, delayed or in flight: no further attempt can come (no event will either).
    wait_for(lambda: not env.busy(controller), what="the queue to be idle")
    assert len(attempts) == 4


def test_terminal_errors_are_counted_but_not_retried(env: Harness) -> None:
    attempts: list[str] = []

    def reconcile(key: str) -> Result:
        attempts.append(key)
        raise TerminalError("InvalidSizeClass", "no such class")

    key = env.create("bad")
    controller = env.controller("terminal", reconcile)
    controller.start()
    wait_for(lambda: env.errors("terminal", "InvalidSizeClass") == 1)
    assert controller.queue.pending() == 0 and controller.queue.num_requeues(key) == 0
    assert env.errors("terminal", "InvalidSizeClass", retryable="false") == 1  # the label tells it apart
    # A new change brings it back (level-based: events are hints).
    env.rest.patch(CONFIGMAPS, "bad", {"data": {"v": "1"}}, env.namespace)
    wait_for(lambda: len(attempts) == 2)


def test_a_terminal_error_may_ask_for_one_slow_requeue_instead_of_backoff(env: Harness) -> None:
    """TerminalError(requeue_after=s): counted as retryable="false", no backoff, the key due in s."""
    attempts: list[str] = []
    failure = ReconcileError("AdminUnavailable", "connection refused")

    def reconcile(key: str) -> Result:
        attempts.append(key)
        if len(attempts) == 1:
            raise failure  # retryable: backoff, counted with retryable="true"
        raise TerminalError("EnsureFailed", "create failed: name_taken", requeue_after=300)

    key = env.create("slow")
    controller = env.controller("slow", reconcile)
    controller.start()
    wait_for(lambda: env.errors("slow", "EnsureFailed") == 1)
    assert env.errors("slow", "AdminUnavailable", retryable="true") == 1
    assert env.errors("slow", "EnsureFailed", retryable="false") == 1
    due = wait_for(lambda: controller.queue.due_in(key), what="the slow requeue")
    assert 290 < due <= 300  # one requeue in five minutes, not the next backoff step (0.1 s)
    assert controller.queue.num_requeues(key) == 0  # the backoff was forgotten
    assert len(attempts) == 2


def test_a_retry_cap_keeps_the_backoff_of_a_flaky_cause_short(env: Harness) -> None:
    """ReconcileError(retry_cap=s): retried with the growing backoff, but never more than s apart (a
    failure caused by a flaky shard: once the shard recovers, the key is retried soon, not minutes later)."""
    attempts: list[float] = []

    def reconcile(key: str) -> Result:
        attempts.append(time.monotonic())
        raise ReconcileError("EnsureFailed", "create failed: connection_lost", retry_cap=0.15)

    key = env.create("capped")
    controller = env.controller("capped", reconcile)
    controller.start()
    wait_for(lambda: controller.queue.num_requeues(key) >= 8, what="eight retries")
    # Without the cap the backoff would be at 0.05 * 2**7 = 6.4 s, capped at FAST's 0.4 s.
    due = wait_for(lambda: controller.queue.due_in(key), what="the next retry")
    assert due <= 0.15
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert max(gaps) < 0.15 + 0.1, gaps
    assert env.errors("capped", "EnsureFailed", retryable="true") >= 8


def test_a_write_conflict_is_requeued_and_counted_as_conflict_not_error(env: Harness) -> None:
    """The reconcile writes from the cached object with its resourceVersion; another writer
    changed the object first, so the apiserver answers 409. The retry (after backoff) reads the
    fresh object from the cache and succeeds."""
    attempts: list[str] = []
    rest = env.rest

    def reconcile(key: str) -> Result:
        namespace, name = split_key(key)
        cached = env.informer.get(key)
        if cached is None:
            return Result()
        attempts.append(cached["metadata"]["resourceVersion"])
        if cached["data"].get("owner") == "controller":
            return Result()
        if len(attempts) == 1:  # another writer gets in between our read and our write
            rest.patch(CONFIGMAPS, name, {"data": {"other": "writer"}}, namespace)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": cached["metadata"]["resourceVersion"],
            },
            "data": {**cached["data"], "owner": "controller"},
        }
        rest.replace(CONFIGMAPS, body)  # 409 if the resourceVersion is stale
        return Result()

    controller = env.controller("conflicting", reconcile)
    env.create("contested")
    controller.start()
    wait_for(lambda: rest.get(CONFIGMAPS, "contested", env.namespace)["data"].get("owner") == "controller", timeout=10)
    final = rest.get(CONFIGMAPS, "contested", env.namespace)["data"]
    assert final == {"v": "0", "other": "writer", "owner": "controller"}  # nobody's write was lost
    assert env.conflicts("conflicting") >= 1
    assert env.errors("conflicting", "Other") == 0


def test_a_reconcile_error_raised_for_a_409_is_an_error_with_its_reason(env: Harness) -> None:
    """Raising ReconcileError is the reconciler's own classification, even when caused by a 409."""

    def reconcile(key: str) -> Result:
        try:
            env.rest.create(CONFIGMAPS, configmap(split_key(key)[1], env.namespace))  # exists: 409
        except ApiException as exc:
            raise ReconcileError("CredentialsSecretConflict") from exc
        return Result()

    controller = env.controller("classifying", reconcile)
    env.create("taken")
    controller.start()
    wait_for(lambda: env.errors("classifying", "CredentialsSecretConflict") >= 1)
    assert env.conflicts("classifying") == 0


# -- parallelism ---------------------------------------------------------------------------------


def test_one_key_is_never_reconciled_twice_at_once_while_keys_run_in_parallel(env: Harness) -> None:
    lock = threading.Lock()
    active: dict[str, int] = defaultdict(int)
    peak_per_key: dict[str, int] = defaultdict(int)
    peak_total = 0
    runs: dict[str, int] = defaultdict(int)
    hot_started = threading.Event()

    def reconcile(key: str) -> Result:
        nonlocal peak_total
        with lock:
            active[key] += 1
            peak_per_key[key] = max(peak_per_key[key], active[key])
            peak_total = max(peak_total, sum(active.values()))
            runs[key] += 1
        if key.endswith("/hot"):
            hot_started.set()
        time.sleep(0.3)
        with lock:
            active[key] -= 1
        return Result()

    keys = [env.create(name) for name in ("hot", "b", "c", "d")]
    controller = env.controller("parallel", reconcile, workers=4)
    controller.start()
    assert hot_started.wait(5)
    # While "hot" is being reconciled, it changes many times (events) and is enqueued directly.
    for i in range(5):
        env.rest.patch(CONFIGMAPS, "hot", {"data": {"v": str(i + 1)}}, env.namespace)
        controller.enqueue(keys[0])
    wait_for(lambda: runs[keys[0]] >= 2 and not env.busy(controller), timeout=10)

    assert all(peak == 1 for peak in peak_per_key.values()), dict(peak_per_key)
    assert peak_total >= 3  # different keys did run side by side
    assert set(runs) == set(keys)
    assert 2 <= runs[keys[0]] <= 3  # the bursts collapsed into one or two more passes


def test_an_update_event_queues_its_key_once(env: Harness) -> None:
    """The old and the new object of an update map to the same key: queued once, one pass. Queued once per
    object, a worker that took the key after the first add ran it again after the second (a Shard pass
    twice for one status change)."""
    key = env.create("updated")
    started = threading.Event()
    runs: list[str] = []

    def keys(obj: dict[str, object]) -> list[str]:
        if obj["data"] == {"v": "1"}:  # the new object: give a worker the time to take a key already queued
            started.wait(1.0)
        return [key]

    def reconcile(name: str) -> Result:
        runs.append(name)
        started.set()
        return Result()

    controller = Controller("updates", reconcile, queue=WorkQueue(ExponentialBackoff(*FAST)), metrics=env.metrics)
    env.controllers.append(controller)
    controller.watch(env.informer, keys)
    controller.start()  # the resync's pass
    wait_for(lambda: runs and not env.busy(controller), what="the first pass done")
    started.clear()
    env.rest.patch(CONFIGMAPS, "updated", {"data": {"v": "1"}}, env.namespace)
    wait_for(lambda: len(runs) >= 2 and not env.busy(controller), what="the update's pass done")
    assert runs == [key, key]


def test_a_hung_lane_holds_only_its_own_workers_and_a_key_that_changes_lane_moves(env: Harness) -> None:
    """Lanes read from the cache (a ConfigMap's `lane`), two workers per lane, five in all: the hung
    lane's reconciles block and hold two workers; the other lane's keys all run meanwhile, and a
    key of the hung lane whose object moves to another lane runs there at once."""
    release = threading.Event()
    seen: list[tuple[str, str | None]] = []  # (key, lane of the slot it ran in)
    lock = threading.Lock()

    def lane_of(key: str) -> str:
        return ((env.informer.get(key) or {}).get("data") or {}).get("lane", "none")

    def reconcile(key: str) -> Result:
        slot = current_slot()
        with lock:
            seen.append((key, slot.lane if slot else None))
        if slot is not None and slot.lane == "hung":
            release.wait(30)
        return Result()

    hung = [env.create(f"hung-{i}", {"lane": "hung"}) for i in range(5)]
    free = [env.create(f"free-{i}", {"lane": "free"}) for i in range(6)]
    controller = env.controller("lanes", reconcile, workers=5, lanes=Lanes(lane_of, 2))
    controller.start()
    try:
        wait_for(lambda: {k for k, _ in seen} >= set(free), what="every free lane key while the hung lane hangs")
        assert controller.queue.lane_stats()["hung"] == (3, 2)  # two held, three waiting: not five
        waiting = next(k for k in hung if k not in {key for key, _ in seen})
        env.rest.patch(CONFIGMAPS, split_key(waiting)[1], {"data": {"lane": "free"}}, env.namespace)
        wait_for(lambda: (waiting, "free") in seen, what="the moved key to run in its new lane")
        assert all(lane == "free" for key, lane in seen if key in free)
    finally:
        release.set()
    wait_for(lambda: not env.busy(controller), what="the hung keys to finish once released")


def test_a_pass_that_releases_its_slot_lets_the_lanes_next_key_run_while_it_finishes(env: Harness) -> None:
    """One slot per lane: a pass that gave its slot back (its SQL done, its status write left) keeps
    running, the lane's next key runs beside it in the same slot, and the first key is not run twice."""
    writing = threading.Event()
    finish = threading.Event()
    running: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    slots: list[tuple[str, int | None]] = []
    lock = threading.Lock()

    def reconcile(key: str) -> Result:
        slot = current_slot()
        with lock:
            running[key] += 1
            peak[key] = max(peak[key], running[key])
            slots.append((key, slot.index if slot else None))
        try:
            if key.endswith("/first"):
                release_slot()  # the lane's work is done; the apiserver write is left
                assert current_slot() is None
                writing.set()
                finish.wait(30)
        finally:
            with lock:
                running[key] -= 1
        return Result()

    first = env.create("first", {"lane": "one"})
    assert wait_for(lambda: env.informer.get(first) is not None)
    controller = env.controller("release", reconcile, workers=3, lanes=Lanes(lambda key: "one", 1))
    controller.start()
    try:
        assert writing.wait(10)
        second = env.create("second", {"lane": "one"})
        wait_for(lambda: (second, 0) in slots, what="the next key to run in the released slot")
        env.rest.patch(CONFIGMAPS, "first", {"data": {"lane": "one", "v": "2"}}, env.namespace)
        controller.enqueue(first)
        assert running[first] == 1  # an event while its pass finishes: not a second worker
    finally:
        finish.set()
    wait_for(lambda: sum(1 for key, _ in slots if key == first) >= 2 and not env.busy(controller))
    assert peak[first] == 1


def test_requeue_after_runs_the_key_again(env: Harness) -> None:
    times: list[float] = []

    def reconcile(key: str) -> Result:
        times.append(time.monotonic())
        return Result(requeue_after=0.2) if len(times) < 3 else Result()

    env.create("ticking")
    controller = env.controller("periodic", reconcile)
    controller.start()
    wait_for(lambda: len(times) == 3, timeout=5)
    assert all(b - a >= 0.18 for a, b in zip(times, times[1:], strict=False))


# -- stopping ------------------------------------------------------------------------------------


def test_stop_finishes_in_flight_reconciles_then_returns_and_runs_nothing_new(env: Harness) -> None:
    entered = threading.Event()
    release = threading.Event()
    outcomes: list[str] = []
    keys_seen: list[str] = []

    def reconcile(key: str) -> Result:
        keys_seen.append(key)
        entered.set()
        release.wait(10)
        try:
            ensure_active()  # the write guard: a stopping controller must not write
            outcomes.append("wrote")
        except ControllerStopping:
            outcomes.append("refused")
            raise
        return Result()

    controller = env.controller("stopping", reconcile)
    env.create("slow")
    controller.start()
    assert entered.wait(5)
    stopped = threading.Event()
    at_return: list[str] = []  # what the in-flight reconcile had done when stop() returned

    def stop() -> None:
        controller.stop()
        at_return.extend(outcomes)
        stopped.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    wait_for(lambda: not controller.active())
    ensure_active()  # the guard is per worker: outside one (the API, this test) writes go on while it stops
    env.create("after-stop")
    release.set()
    assert stopped.wait(5)
    stopper.join()
    assert at_return == ["refused"], "stop() must wait for the in-flight reconcile"
    assert outcomes == ["refused"]
    assert keys_seen == [f"{env.namespace}/slow"]
    assert env.errors("stopping", "Other") == 0


def test_a_restarted_controller_reconciles_every_object_again(env: Harness) -> None:
    seen: list[str] = []
    controller = env.controller("restartable", lambda key: seen.append(key) or Result())
    keys = {env.create(name) for name in ("x", "y")}
    controller.start()
    wait_for(lambda: set(seen) == keys)
    controller.stop()
    env.create("while-stopped")
    seen.clear()
    controller.start()
    wait_for(lambda: set(seen) == keys | {f"{env.namespace}/while-stopped"})


# -- leadership blips ----------------------------------------------------------------------------


def test_a_leadership_blip_loses_no_key(env: Harness) -> None:
    """While the guard says no (a late renewal) keys wait, and a reconcile it cut short runs again."""
    leading = threading.Event()
    leading.set()
    done: list[str] = []
    blipped = threading.Event()

    def reconcile(key: str) -> Result:
        if key.endswith("/first") and not blipped.is_set():
            blipped.set()
            leading.clear()  # the renew deadline passes in the middle of this reconcile
        ensure_active()
        done.append(key)
        return Result()

    controller = env.controller("blip", reconcile, workers=2)
    controller.guard = leading.is_set
    first = env.create("first")
    controller.start()
    assert blipped.wait(5)
    second = env.create("second")  # arrives while not leading: held, not dropped
    # Both workers hold a key (the cut-short one again, and the new one), waiting for the guard.
    wait_for(lambda: controller.queue.processing() == 2, what="both keys held by the workers")
    assert done == [] and controller.running
    leading.set()  # the late renewal succeeded
    wait_for(lambda: sorted(done) == sorted([first, second]), what="both keys reconciled after the blip")
    assert env.errors("blip", "Other") == 0


def test_resync_enqueues_every_object_of_a_running_controller(env: Harness) -> None:
    seen: list[str] = []
    controller = env.controller("resync", lambda key: seen.append(key) or Result())
    assert controller.resync() == 0  # not running: nothing to do
    keys = {env.create(name) for name in ("p", "q")}
    controller.start()
    wait_for(lambda: set(seen) == keys)
    seen.clear()
    assert controller.resync() == 2
    wait_for(lambda: sorted(seen) == sorted(keys), what="a full pass after resync")


def test_a_resync_counts_settled_keys_as_reconciled_and_runs_only_the_others(env: Harness) -> None:
    """A start over 100,000 settled Databases hands none of them to a worker; events still do."""
    seen: list[str] = []
    settled_key = env.create("settled")
    other = env.create("other")
    broken = env.create("broken")

    def settled(key: str) -> bool:
        if key == broken:
            raise RuntimeError("a bug in the shortcut")  # the worker decides instead
        return key == settled_key

    controller = env.controller("settled", lambda key: seen.append(key) or Result(), settled=settled)
    controller.start()
    wait_for(lambda: sorted(seen) == sorted([other, broken]), what="the keys that were not settled")
    passes = env.metrics.registry.get_sample_value("dbprovider_reconciles_total", {"controller": "settled"})
    assert passes == 3  # the settled key counts as looked at
    env.rest.patch(CONFIGMAPS, "settled", {"data": {"v": "1"}}, env.namespace)
    wait_for(lambda: settled_key in seen, what="an event of the settled key reaching the worker")
