"""Who gets in, and in which order: the front door's bounds by client address and by consumer.

Connections (`Connections`, loop thread only):
- at most `max_total` open connections; when full, a new connection takes the place of one that
  waits without a request in progress: the longest parked one, else the longest waiting one (in its
  handshake, headers or keep-alive) of the client that holds the most such connections, so attackers
  holding slots cannot lock legitimate clients out. Only when every connection has a request in
  progress is a new one closed at once;
- a connection is *unauthenticated* until one of its requests authenticates (the app calls the hook
  the server puts into the WSGI environ). At most `max_per_client` unauthenticated connections per
  client address run at once; more from that address are *parked*: accepted, nothing read, and
  started in turn as the address's others authenticate or close (a burst of 200 from one consumer
  cluster's egress address waits a moment instead of being reset), or dropped after the header deadline.

Requests (`Lanes`, loop thread; `ConsumerRequests`, any thread):
- app calls run on the worker pool in lanes: requests with the same credentials (Authorization
  header) share a lane, requests without credentials their address' lane; lanes take turns, each with
  at most `per_lane` calls at once, so one consumer's burst waits in its own lane (not refused, and not
  in front of everyone else) until the request deadline;
- an authenticated consumer has at most `per_consumer` requests in the app at once, whatever
  credentials, connections and addresses they come from; the next gets 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
# The WSGI environ key of the server's hook: `environ[AUTHENTICATED_HOOK](consumer) -> bool`, called by
# the app once a request authenticated; False means the consumer is over its bound (answer 429).
AUTHENTICATED_HOOK = "dbprovider.authenticated"


class State(enum.Enum):
    PARKED = "parked"  # accepted, waiting for its address' turn; nothing read
    OPENING = "opening"  # TLS handshake and request headers
    BUSY = "busy"  # a request being read, in the app or being answered
    IDLE = "idle"  # keep-alive, between requests


class Slot:
    """One admitted connection's place in the bounds."""

    __slots__ = ("client", "consumer", "state", "task", "turn", "evicted", "released")

    def __init__(self, client: str) -> None:
        self.client = client
        self.consumer: str | None = None
        self.state = State.OPENING
        self.task: asyncio.Task[Any] | None = None
        self.turn: asyncio.Future[None] | None = None  # set while parked
        self.evicted = False
        self.released = False

    @property
    def owner(self) -> str:
        """Who holds the connection, for fairness when making room: its consumer, else its address."""
        return f"consumer:{self.consumer}" if self.consumer is not None else f"address:{self.client}"


class Connections:
    """Open connections, bounded overall and (unauthenticated ones) per address. Loop thread only."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self.unauthenticated: dict[str, int] = {}
        self._parked: dict[str, deque[Slot]] = {}  # by address, oldest first
        self._parked_order: OrderedDict[Slot, None] = OrderedDict()
        self._waiting: dict[str, OrderedDict[Slot, None]] = {}  # IDLE and OPENING slots by owner, oldest first

    def admit(self, client: str) -> tuple[Slot | None, Slot | None, str | None]:
        """(the new connection's slot or None, a connection evicted for it or None, why refused or None)."""
        victim = None
        if self.total >= self.max_total:
            victim = self.evict_one()
            if victim is None:
                return None, None, f"{self.total} connections open, all busy (maxConnections {self.max_total})"
        slot = Slot(client)
        self.total += 1
        if self.unauthenticated.get(client, 0) >= self.max_per_client:
            slot.state = State.PARKED
            slot.turn = asyncio.get_running_loop().create_future()
            self._parked.setdefault(client, deque()).append(slot)
            self._parked_order[slot] = None
        else:
            self.unauthenticated[client] = self.unauthenticated.get(client, 0) + 1
            self._enter(slot)
        return slot, victim, None

    def evict_one(self) -> Slot | None:
        """Make room: the longest parked connection, else the longest waiting one of the client (consumer
        or address) with the most connections waiting. Returned already released; None if all are busy."""
        if self._parked_order:
            victim = next(iter(self._parked_order))
        elif self._waiting:
            lane = max(self._waiting, key=lambda key: len(self._waiting[key]))
            victim = next(iter(self._waiting[lane]))
        else:
            return None
        self.release(victim)
        victim.evicted = True
        return victim

    def move(self, slot: Slot, state: State) -> None:
        """A connection starts a request (BUSY) or waits for the next (IDLE)."""
        if slot.released or slot.state is state or slot.state is State.PARKED:
            return
        self._leave(slot)
        slot.state = state
        self._enter(slot)

    def authenticated(self, slot: Slot, consumer: str) -> None:
        """A request on `slot` authenticated: it no longer counts against its address."""
        if slot.released or slot.consumer == consumer:
            return
        self._leave(slot)
        if slot.consumer is None:
            self._leave_address(slot.client)
        slot.consumer = consumer
        self._enter(slot)

    def release(self, slot: Slot) -> None:
        """The connection closed (or was evicted): give its places back, start a parked one."""
        if slot.released:
            return
        slot.released = True
        self.total -= 1
        if slot.state is State.PARKED:
            self._parked_order.pop(slot, None)
            parked = self._parked[slot.client]
            parked.remove(slot)
            if not parked:
                del self._parked[slot.client]
            if slot.turn is not None and not slot.turn.done():
                slot.turn.cancel()
            return
        self._leave(slot)
        if slot.consumer is None:
            self._leave_address(slot.client)

    def _enter(self, slot: Slot) -> None:
        if slot.state in (State.OPENING, State.IDLE):
            self._waiting.setdefault(slot.owner, OrderedDict())[slot] = None

    def _leave(self, slot: Slot) -> None:
        waiting = self._waiting.get(slot.owner)
        if waiting is not None and waiting.pop(slot, 0) is None and not waiting:
            del self._waiting[slot.owner]

    def _leave_address(self, client: str) -> None:
        parked = self._parked.get(client)
        if parked:  # the address' place goes to its longest parked connection
            slot = parked.popleft()
            if not parked:
                del self._parked[client]
            self._parked_order.pop(slot, None)
            slot.state = State.OPENING
            self._enter(slot)
            if slot.turn is not None and not slot.turn.done():
                slot.turn.set_result(None)
            return
        count = self.unauthenticated[client] - 1
        if count:
            self.unauthenticated[client] = count
        else:
            del self.unauthenticated[client]


class Lanes:
    """App calls on the worker pool, lanes taking turns, at most `per_lane` of a lane at once. Loop only.

    A call holds its thread and its lane's place until the app returns, even after its caller gave up
    (a deadline): a stuck handler keeps its thread, and the accounting says so.
    """

    def __init__(self, executor: concurrent.futures.Executor, threads: int, per_lane: int) -> None:
        self.executor = executor
        self.threads = threads
        self.per_lane = per_lane
        self.running = 0
        self._by_lane: dict[str, int] = {}
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    async def run(self, lane: str, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker in `lane`'s turn. Cancelling (a deadline) leaves a running call running."""
        if self._queues or not self._free(lane):
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queues.setdefault(lane, deque()).append(turn)
            self._next()
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._finished(lane)  # its turn came just as it was cancelled: pass it on
                else:
                    self._forget(lane, turn)
                raise
        else:
            self._take(lane)
        loop = asyncio.get_running_loop()

        def finished(_: object) -> None:
            if not loop.is_closed():  # after the server stopped, nobody counts any more
                loop.call_soon_threadsafe(self._finished, lane)

        future = self.executor.submit(fn, *args)
        future.add_done_callback(finished)
        return await asyncio.wrap_future(future)

    def _free(self, lane: str) -> bool:
        return self.running < self.threads and self._by_lane.get(lane, 0) < self.per_lane

    def _take(self, lane: str) -> None:
        self.running += 1
        self._by_lane[lane] = self._by_lane.get(lane, 0) + 1

    def _finished(self, lane: str) -> None:
        self.running -= 1
        count = self._by_lane[lane] - 1
        if count:
            self._by_lane[lane] = count
        else:
            del self._by_lane[lane]
        self._next()

    def _forget(self, lane: str, turn: asyncio.Future[None]) -> None:
        queue = self._queues.get(lane)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._queues[lane]

    def _next(self) -> None:
        """Hand free threads to waiting lanes in turn (each lane goes to the back after its turn)."""
        skipped = 0
        while self._queues and self.running < self.threads and skipped < len(self._queues):
            lane, queue = next(iter(self._queues.items()))
            self._queues.move_to_end(lane)
            if self._by_lane.get(lane, 0) >= self.per_lane:
                skipped += 1
                continue
            turn = queue.popleft()
            if not queue:
                del self._queues[lane]
            if turn.done():  # its caller gave up meanwhile
                continue
            self._take(lane)
            turn.set_result(None)
            skipped = 0


class ConsumerRequests:
    """Requests of each consumer inside the app, at most `per_consumer` at once (thread-safe)."""

    def __init__(self, per_consumer: int) -> None:
        self.per_consumer = per_consumer
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def acquire(self, consumer: str) -> bool:
        with self._lock:
            count = self._counts.get(consumer, 0)
            if count >= self.per_consumer:
                return False
            self._counts[consumer] = count + 1
            return True

    def release(self, consumer: str) -> None:
        with self._lock:
            count = self._counts[consumer] - 1
            if count:
                self._counts[consumer] = count
            else:
                del self._counts[consumer]
