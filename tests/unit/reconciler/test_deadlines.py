"""The process' one deadline thread (reconciler.sql.deadlines): what every SQL operation's bound relies on.

An operation's watchdog schedules its cut there and cancels it when the operation is done; a cut
that is due must happen whatever else was scheduled or cancelled, and a cancelled one never."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from functools import partial

from reconciler.sql.deadlines import Deadlines

WAIT = 10.0  # seconds to wait for something that must happen (never a bound that is asserted)


def recorder() -> tuple[list[str], Callable[[str], Callable[[], None]]]:
    seen: list[str] = []

    def record(name: str) -> Callable[[], None]:
        return lambda: seen.append(name)

    return seen, record


def test_due_actions_run_in_deadline_order_whatever_order_they_came_in() -> None:
    deadlines, done = Deadlines(), threading.Event()
    seen, record = recorder()
    now = time.monotonic()
    deadlines.at(now + 0.06, done.set)
    deadlines.at(now + 0.04, record("third"))
    deadlines.at(now + 0.02, record("second"))
    deadlines.at(now - 1.0, record("first"))  # already due

    assert done.wait(WAIT)
    assert seen == ["first", "second", "third"]
    assert deadlines.pending() == 0


def test_a_cancelled_action_never_runs_and_a_later_one_still_does() -> None:
    deadlines, done = Deadlines(), threading.Event()
    seen, record = recorder()
    now = time.monotonic()
    first = deadlines.at(now + 0.02, record("cancelled first"))
    deadlines.at(now + 0.04, record("kept"))
    deadlines.at(now + 0.06, done.set)
    deadlines.cancel(first)
    deadlines.cancel(first)  # twice: harmless

    assert done.wait(WAIT)
    assert seen == ["kept"]


def test_an_action_that_fails_does_not_stop_the_deadlines_after_it() -> None:
    deadlines, done = Deadlines(), threading.Event()

    def broken() -> None:
        raise RuntimeError("a bug in one action")

    deadlines.at(time.monotonic(), broken)
    deadlines.at(time.monotonic() + 0.02, done.set)

    assert done.wait(WAIT)


def test_an_earlier_deadline_wakes_a_thread_sleeping_until_a_later_one() -> None:
    deadlines, done = Deadlines(), threading.Event()
    far = deadlines.at(time.monotonic() + 3600, lambda: None)  # the thread now sleeps for an hour
    deadlines.at(time.monotonic() + 0.02, done.set)

    assert done.wait(WAIT)
    deadlines.cancel(far)
    assert deadlines.pending() == 0


class Session:
    """Stands for what a watchdog's action holds: the operation's connection."""


def test_a_cancelled_deadline_holds_nothing_until_its_time() -> None:
    """A burst of quick operations bounded by minutes keeps none of their connections alive until
    their deadlines come: cancelling drops the action and what it holds at once."""
    deadlines = Deadlines()
    sessions = [Session() for _ in range(500)]
    alive = [weakref.ref(session) for session in sessions]
    scheduled = [deadlines.at(time.monotonic() + 120, partial(id, session)) for session in sessions]
    del sessions
    for deadline in scheduled:
        deadlines.cancel(deadline)

    assert deadlines.pending() == 0
    assert not any(ref() is not None for ref in alive)
