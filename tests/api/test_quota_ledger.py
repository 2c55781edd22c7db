"""The quota ledger's group commit on the real apiserver: the creates that arrive while a ledger write is
in flight share the next one, a create whose slot is written goes on without waiting for the next write,
and replicas writing one ledger at once stay exact, a lost claim (a slot another replica took) costing a
read and never a slot too many. A slot edited into something no replica writes is given back."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from api.errors import QuotaExceeded
from api.quota_ledgers import QuotaLedgers, Reservation
from domain.naming import quota_ledger_name
from domain.objects import Obj
from domain.quota import QuotaLedger
from informers import CONFIGMAPS, Resource, Rest
from informers.rest import JSON_PATCH
from tests.api.support import NAMESPACE, ApiEnv
from tests.support.common import unique, wait_for


@dataclass
class Gate:
    """Where a held write waits: `reached` once it is at the door, sent on when `open` is set."""

    reached: threading.Event = field(default_factory=threading.Event)
    open: threading.Event = field(default_factory=threading.Event)


class LedgerClaims(Rest):
    """One replica's client of the real apiserver, counting the ledger's claim writes (JSON patches) and
    their answers; `hold(n)` keeps the n-th claim write (from 0) at the door until its gate opens."""

    def __init__(self, rest: Rest) -> None:
        super().__init__(rest.api_client)
        self.answers: list[int | str] = []  # per claim write: the slots it claimed, or "refused"
        self._lock = threading.Lock()
        self._gates: dict[int, Gate] = {}

    def hold(self, index: int) -> Gate:
        gate = self._gates[index] = Gate()
        return gate

    def patch(self, resource: Resource, name: str, patch: Any, namespace: str | None = None, **kwargs: Any) -> Obj:
        if resource != CONFIGMAPS or kwargs.get("content_type") != JSON_PATCH:
            return super().patch(resource, name, patch, namespace, **kwargs)
        with self._lock:
            index = len(self.answers)
            self.answers.append("in flight")
            gate = self._gates.get(index)
        if gate is not None:
            gate.reached.set()
            assert gate.open.wait(30), "the held write was never let through"
        try:
            written = super().patch(resource, name, patch, namespace, **kwargs)
        except Exception:
            self.answers[index] = "refused"
            raise
        self.answers[index] = sum(op["op"] == "replace" for op in patch)
        return written


def replica(rest: LedgerClaims, limit: int, registry: CollectorRegistry | None = None) -> QuotaLedgers:
    """One replica's quota ledgers; its cache shows no database (the reservations create none)."""
    clock = lambda: datetime.now(UTC)  # noqa: E731
    return QuotaLedgers(rest, NAMESPACE, lambda _: limit, lambda _: {}, clock=clock, registry=registry)


def ledger_holders(env: ApiEnv, consumer: str) -> set[str]:
    obj = env.admin.get(CONFIGMAPS, quota_ledger_name(consumer), NAMESPACE)
    return set(QuotaLedger.parse(consumer, obj).held())


class Creates:
    """reserve() of each externalId on its own thread (like the API's workers); their answers."""

    def __init__(self, ledgers: QuotaLedgers, consumer: str) -> None:
        self.ledgers, self.consumer = ledgers, consumer
        self.answers: dict[str, Reservation | BaseException] = {}
        self.threads: list[threading.Thread] = []

    def start(self, *external_ids: str) -> None:
        for external_id in external_ids:
            thread = threading.Thread(target=self._reserve, args=(external_id,))
            thread.start()
            self.threads.append(thread)

    def _reserve(self, external_id: str) -> None:
        try:
            self.answers[external_id] = self.ledgers.reserve(self.consumer, external_id)
        except Exception as exc:  # noqa: BLE001 - the answer under test
            self.answers[external_id] = exc

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)

    def granted(self) -> set[str]:
        return {ext for ext, answer in self.answers.items() if isinstance(answer, Reservation)}


def waiting(ledgers: QuotaLedgers, consumer: str, count: int) -> Callable[[], bool]:
    """Whether `count` creates wait for the next ledger write (the replica's queue, not visible outside)."""
    return lambda: len(ledgers._ledgers[consumer].pending) == count


def test_creates_arriving_during_a_write_share_the_next_one(env: ApiEnv) -> None:
    consumer = unique("ledger-c")
    rest = LedgerClaims(env.admin)
    ledgers = replica(rest, 30)
    creates = Creates(ledgers, consumer)
    first = rest.hold(0)
    creates.start("first")
    assert first.reached.wait(30)
    creates.start(*(f"next-{n}" for n in range(19)))
    wait_for(waiting(ledgers, consumer, 19), 30, "19 creates waiting for the next write")
    first.open.set()
    creates.join()
    assert rest.answers == [1, 19]  # two writes for 20 creates
    assert creates.granted() == set(creates.answers)
    assert ledger_holders(env, consumer) == set(creates.answers)


def test_a_create_whose_slot_is_written_does_not_wait_for_the_next_write(env: ApiEnv) -> None:
    consumer = unique("ledger-c")
    rest = LedgerClaims(env.admin)
    ledgers = replica(rest, 10)
    creates = Creates(ledgers, consumer)
    first, second, third = rest.hold(0), rest.hold(1), rest.hold(2)
    creates.start("a")
    assert first.reached.wait(30)
    creates.start("b1", "b2", "b3")  # the second write, for all three
    wait_for(waiting(ledgers, consumer, 3), 30, "three creates waiting for the second write")
    first.open.set()
    assert second.reached.wait(30)
    creates.start("c")  # the third write, held at the door until the end
    wait_for(waiting(ledgers, consumer, 1), 30, "one create waiting for the third write")
    second.open.set()
    assert third.reached.wait(30)
    # The second write's three creates have their slots while the third write is still in flight.
    wait_for(lambda: {"a", "b1", "b2", "b3"} <= set(creates.answers), 30, "the decided creates to go on")
    assert "c" not in creates.answers
    third.open.set()
    creates.join()
    assert rest.answers == [1, 3, 1]
    assert ledger_holders(env, consumer) == {"a", "b1", "b2", "b3", "c"}


def test_a_claim_lost_to_another_replica_reads_the_ledger_again_and_refuses_at_the_quota(env: ApiEnv) -> None:
    consumer = unique("ledger-c")
    one, other = LedgerClaims(env.admin), LedgerClaims(env.admin)
    first, second = replica(one, 3), replica(other, 3)
    first.reserve(consumer, "a1")  # the first replica's view: one slot held, two free
    for external_id in ("b1", "b2"):
        second.reserve(consumer, external_id)  # takes both free slots
    try:
        first.reserve(consumer, "a2")  # claims a slot its view shows free: lost, read again, none left
        raise AssertionError("a create over the quota was granted")
    except QuotaExceeded:
        pass
    assert one.answers == [1, "refused"]
    assert ledger_holders(env, consumer) == {"a1", "b1", "b2"}


def test_three_replicas_bursting_at_once_grant_exactly_the_quota(env: ApiEnv) -> None:
    consumer = unique("ledger-c")
    clients = [LedgerClaims(env.admin) for _ in range(3)]
    bursts = [Creates(replica(rest, 25), consumer) for rest in clients]
    for n, creates in enumerate(bursts):
        creates.start(*(f"r{n}-{i}" for i in range(20)))
    for creates in bursts:
        creates.join()
    answers = Counter(type(a).__name__ for creates in bursts for a in creates.answers.values())
    assert answers == {"Reservation": 25, "QuotaExceeded": 35}
    granted = set().union(*(creates.granted() for creates in bursts))
    assert ledger_holders(env, consumer) == granted
    writes = sum(len(rest.answers) for rest in clients)
    print(f"60 creates on 3 replicas: {writes} claim writes, {sum(r.answers.count('refused') for r in clients)} lost")
    assert writes < 60  # the creates of each replica shared writes


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("future", "ghost 2099-01-01T00:00:00.000000Z"),
        ("malformed", "ghost"),
        ("malformed", "ghost not-a-time"),
        ("unknown_holder", "Ghost_Of_Nobody 2026-12-05T00:00:00.000000Z"),
    ],
)
def test_a_slot_no_replica_can_have_written_is_given_back(
    env: ApiEnv, caplog: pytest.LogCaptureFixture, reason: str, value: str
) -> None:
    consumer = unique("ledger-c")
    rest = LedgerClaims(env.admin)
    ledgers = replica(rest, 2)
    ledgers.reserve(consumer, "a")  # the ledger exists: "a" holds one of two slots
    (free,) = QuotaLedger.parse(consumer, env.admin.get(CONFIGMAPS, quota_ledger_name(consumer), NAMESPACE)).free()
    env.admin.patch(CONFIGMAPS, quota_ledger_name(consumer), {"data": {free: value}}, NAMESPACE)
    # A second replica (its own view of the ledger) is asked for the consumer's second database.
    registry = CollectorRegistry()
    other = replica(LedgerClaims(env.admin), 2, registry)
    assert other.reserve(consumer, "b").slot == free
    assert ledger_holders(env, consumer) == {"a", "b"}
    assert registry.get_sample_value("dbprovider_quota_ledger_repairs_total", {"reason": reason}) == 1
    assert f"freed quota ledger slot {free}, which held an entry no replica can have written ({reason})" in caplog.text
