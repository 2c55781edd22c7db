"""The front door's bounds (api/admission.py) as pure logic: parking, making room, lanes, per-consumer slots.
Behaviour over real sockets is in tests/api/test_front_door.py."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.admission import Connections, ConsumerRequests, Lanes, State


def on_its_own_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The async test run on a loop of its own: asyncio.run() would leave the main thread without an
    event loop, and the Pulumi mocks of tests/generator ask for the current one."""

    @functools.wraps(test)
    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(test())
        finally:
            loop.close()

    return run


@on_its_own_loop
async def test_over_the_address_bound_connections_park_and_start_in_order() -> None:
    limits = Connections(max_total=10, max_per_client=2)
    first, _, _ = limits.admit("a")
    second, _, _ = limits.admit("a")
    parked = [limits.admit("a")[0] for _ in range(2)]
    other, _, _ = limits.admit("b")
    assert first and second and other and all(parked)
    assert [s.state for s in parked] == [State.PARKED, State.PARKED]  # type: ignore[union-attr]
    assert other.state is State.OPENING
    limits.release(first)  # closes: the longest parked one starts
    assert parked[0].state is State.OPENING and parked[0].turn.done()  # type: ignore[union-attr]
    limits.authenticated(second, "consumer-x")  # authenticated: leaves the address' count
    assert parked[1].state is State.OPENING  # type: ignore[union-attr]
    assert limits.unauthenticated == {"a": 2, "b": 1}
    limits.release(second)
    assert limits.unauthenticated == {"a": 2, "b": 1}  # an authenticated connection gives back no place
    assert limits.total == 3


@on_its_own_loop
async def test_a_full_server_makes_room_parked_first_then_the_heaviest_client() -> None:
    limits = Connections(max_total=4, max_per_client=1)
    a1, _, _ = limits.admit("a")
    a2, _, _ = limits.admit("a")  # parked
    b1, _, _ = limits.admit("b")
    c1, _, _ = limits.admit("c")
    assert a2 is not None and a2.state is State.PARKED
    new, victim, _ = limits.admit("d")
    assert new is not None and victim is a2 and victim.evicted  # the parked one first
    limits.move(b1, State.BUSY)
    e1, victim, _ = limits.admit("e")
    assert victim in (a1, c1, new)  # one waiting connection each: the oldest of them
    assert victim is a1
    for slot in (c1, new, e1):
        limits.move(slot, State.BUSY)
    refused, victim, why = limits.admit("f")
    assert refused is None and victim is None and "all busy" in (why or "")
    assert limits.total == 4


@on_its_own_loop
async def test_room_is_taken_from_the_client_with_the_most_waiting_connections() -> None:
    limits = Connections(max_total=4, max_per_client=10)
    legit, _, _ = limits.admit("legit")
    for _ in range(3):
        limits.admit("attacker")
    for _ in range(5):
        _, victim, _ = limits.admit("attacker")
        assert victim is not None and victim.client == "attacker"
    assert not legit.released


@on_its_own_loop
async def test_lanes_take_turns_and_bound_each_lane() -> None:
    executor = ThreadPoolExecutor(2)
    lanes = Lanes(executor, threads=2, per_lane=1)
    order: list[str] = []
    gate = threading.Event()

    def work(name: str) -> str:
        order.append(name)
        gate.wait(5)
        return name

    calls = [asyncio.create_task(lanes.run(lane, work, f"{lane}{n}")) for lane in "ab" for n in range(3)]
    await asyncio.sleep(0.2)
    assert sorted(order) == ["a0", "b0"]  # one per lane at a time, though both lanes queue 3
    gate.set()
    results = await asyncio.gather(*calls)
    executor.shutdown()
    assert results == ["a0", "a1", "a2", "b0", "b1", "b2"]


@on_its_own_loop
async def test_a_call_given_up_keeps_its_thread_until_it_returns() -> None:
    executor = ThreadPoolExecutor(1)
    lanes = Lanes(executor, threads=1, per_lane=1)
    release = threading.Event()
    stuck = asyncio.create_task(lanes.run("a", release.wait, 5))
    await asyncio.sleep(0.1)
    stuck.cancel()  # the request deadline
    await asyncio.sleep(0.1)
    assert lanes.running == 1  # the handler still runs on the only thread
    waiting = asyncio.create_task(lanes.run("b", time.monotonic))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    release.set()
    assert await asyncio.wait_for(waiting, 5) > 0
    assert lanes.running == 0
    executor.shutdown()


def test_consumer_requests_are_bounded_per_consumer() -> None:
    slots = ConsumerRequests(per_consumer=2)
    assert slots.acquire("x") and slots.acquire("x")
    assert not slots.acquire("x")
    assert slots.acquire("y")
    slots.release("x")
    assert slots.acquire("x")
