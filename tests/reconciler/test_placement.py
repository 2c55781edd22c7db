"""Placement spreads by count, skips unusable shards, never mixes engines, and is deterministic.

The index is fed the informers' events (ADDED/MODIFIED/DELETED with old and new objects) the way
`Informer` delivers them; its wiring to real informers on the apiserver is covered by the
reconciler suite (spread, skips, NoCapacity).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

from domain.config import load_install_config
from domain.connection_budget import Commitments, database_limit, fits
from domain.resources import database_shard
from reconciler.placement_index import PlacementIndex, ShardCandidate

SINCE = "2026-11-30T00:00:00Z"
READY = [{"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": SINCE}]
NOT_READY = [{"type": "Ready", "status": "False", "reason": "Unreachable", "message": "", "lastTransitionTime": SINCE}]


def shard(
    name: str,
    *,
    engine: str = "postgres",
    accepting: bool = True,
    ready: bool = True,
    max_databases: int = 10,
    deleting: bool = False,
    rv: int = 1,
    budget: int | None = 1000,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    cluster = {"keldonCluster" if engine == "cloudberry" else "perconaCluster": {"namespace": "pg", "name": name}}
    admin = {"serviceName": f"{name}-primary", "secretRef": {"namespace": "dbprovider", "name": f"{name}-admin"}}
    return {
        "metadata": meta,
        "spec": {
            "engine": engine,
            "accepting": accepting,
            "maxDatabases": max_databases,
            **cluster,
            "admin": admin,
            "client": {"host": f"{name}.example.com"},
        },
        "status": {
            "conditions": READY if ready else NOT_READY,
            **({"connectionBudget": budget} if budget is not None else {}),
        },
    }


def database(i: int, shard_name: str | None, limit: int | None = None) -> dict[str, Any]:
    """A Database; `limit` its applied CONNECTION LIMIT (else its size class's, connectionLimit.default 10)."""
    status: dict[str, Any] = {"shard": shard_name} if shard_name else {}
    if limit is not None:
        status["appliedConnectionLimit"] = limit
    return {"metadata": {"name": f"db{i}.c", "namespace": "dbprovider"}, "spec": {}, "status": status}


CONFIG = load_install_config({"tls": {"secretName": "t"}, "connectionLimit": {"default": 10}})
LIMIT = partial(database_limit, config=CONFIG)


def index_with(shards: list[dict[str, Any]], counts: dict[str, int]) -> PlacementIndex:
    index = PlacementIndex(database_shard, LIMIT)
    n = 0
    for name, count in counts.items():
        for _ in range(count):
            index.database_event("ADDED", None, database(n, name))
            n += 1
    for s in shards:
        index.shard_event("ADDED", None, s)
    return index


@pytest.mark.parametrize(
    ("shards", "counts", "engine", "expected"),
    [
        pytest.param([shard("a"), shard("b")], {"a": 3, "b": 1}, "postgres", "b", id="fewest-databases"),
        pytest.param([shard("b"), shard("a")], {"a": 2, "b": 2}, "postgres", "a", id="tie-smallest-name"),
        pytest.param([shard("a", accepting=False), shard("b")], {"b": 9}, "postgres", "b", id="skips-draining"),
        pytest.param([shard("a", ready=False), shard("b")], {"b": 5}, "postgres", "b", id="skips-not-ready"),
        pytest.param([shard("a"), shard("b")], {"a": 10, "b": 10}, "postgres", None, id="all-full-no-capacity"),
        pytest.param([shard("a", max_databases=1)], {"a": 0}, "postgres", "a", id="max-one-empty"),
        pytest.param([shard("a", deleting=True)], {}, "postgres", None, id="skips-deleting-shard"),
        pytest.param([shard("a", engine="cloudberry"), shard("b")], {}, "cloudberry", "a", id="engine-match"),
        pytest.param([shard("a"), shard("b")], {}, "cloudberry", None, id="never-mixes-engines"),
        pytest.param([], {}, "postgres", None, id="no-shards"),
        pytest.param([shard("a", max_databases=5), shard("b")], {"a": 4, "b": 4}, "postgres", "a", id="below-limit"),
        pytest.param([shard("a")], {"gone": 3}, "postgres", "a", id="databases-of-unknown-shard-ignored"),
    ],
)
def test_choose(shards, counts, engine, expected) -> None:
    assert index_with(shards, counts).choose(engine) == expected


@pytest.mark.parametrize(
    ("budgets", "limits", "new_limit", "expected"),
    [
        pytest.param({"a": 100, "b": 100}, {"a": [60], "b": [10, 10]}, 50, "b", id="fewest-databases-that-fits"),
        pytest.param({"a": 100, "b": 100}, {"a": [90], "b": [40, 40]}, 30, None, id="fits-nowhere"),
        pytest.param({"a": 100, "b": 100}, {"a": [], "b": [50, 20]}, 30, "a", id="fits-exactly"),
        pytest.param({"a": 100, "b": 50}, {"a": [60], "b": []}, 45, "b", id="skips-the-one-it-does-not-fit"),
        pytest.param({"a": 100}, {"a": [10]}, -1, None, id="unlimited-needs-an-empty-shard"),
        pytest.param({"a": 100, "b": 100}, {"a": [10]}, -1, "b", id="unlimited-on-the-empty-one"),
        pytest.param({"a": 100}, {"a": [-1]}, 1, None, id="nothing-beside-an-unlimited-one"),
        pytest.param({"a": 100}, {"a": [-1]}, 0, "a", id="a-zero-limit-fits-anywhere"),
        pytest.param({"a": None}, {}, 1, None, id="budget-not-read-yet"),
    ],
)
def test_choose_by_connection_budget(budgets, limits, new_limit, expected) -> None:
    index = PlacementIndex(database_shard, LIMIT)
    n = 0
    for name, shard_limits in limits.items():
        for limit in shard_limits:
            index.database_event("ADDED", None, database(n, name, limit))
            n += 1
    for name, budget in budgets.items():
        index.shard_event("ADDED", None, shard(name, budget=budget))
    assert index.choose("postgres", new_limit) == expected


def test_a_database_commits_its_size_class_until_its_applied_limit_is_known() -> None:
    index = index_with([shard("a", budget=25)], {})
    index.database_event("ADDED", None, database(1, "a"))  # placed, not provisioned: the default class, 10
    assert index.choose("postgres", 15) == "a" and index.choose("postgres", 16) is None
    index.database_event("MODIFIED", database(1, "a"), database(1, "a", limit=20))  # provisioned with 20
    assert index.choose("postgres", 5) == "a" and index.choose("postgres", 6) is None
    deleted = database(1, "a", limit=20)
    deleted["status"]["phase"] = "Deleted"
    index.database_event("MODIFIED", database(1, "a", limit=20), deleted)  # dropped: commits nothing
    assert index.choose("postgres", 25) == "a"


def test_a_shard_whose_spec_does_not_validate_is_never_placed_on() -> None:
    """As the Shard controller reports it (Ready False), placement leaves it out, also as a transient lack."""
    broken = shard("a", ready=True)
    del broken["spec"]["admin"]
    index = index_with([broken, shard("b", ready=False)], {})
    assert index.choose("postgres") is None
    assert index.not_ready("postgres") == ["b"]
    index.shard_event("MODIFIED", broken, shard("a", rv=2))  # fixed: a candidate again
    assert index.choose("postgres") == "a"
    index.shard_event("MODIFIED", shard("a", rv=2), broken)  # broken again: dropped
    assert index.choose("postgres") is None


def test_follows_shard_changes_and_deletion() -> None:
    index = index_with([shard("a"), shard("b")], {"a": 1})
    assert index.choose("postgres") == "b"
    index.shard_event("MODIFIED", shard("b"), shard("b", accepting=False, rv=2))
    assert index.choose("postgres") == "a"
    index.shard_event("MODIFIED", shard("a"), shard("a", ready=False, rv=2))
    assert index.choose("postgres") is None
    index.shard_event("MODIFIED", shard("b", accepting=False, rv=2), shard("b", rv=3))
    assert index.choose("postgres") == "b"
    index.shard_event("DELETED", shard("b", rv=3), None)
    assert index.choose("postgres") is None


def test_follows_database_placement_moves_and_deletion() -> None:
    index = index_with([shard("a", max_databases=2), shard("b", max_databases=2)], {})
    index.database_event("ADDED", None, database(1, None))  # not placed yet: counts nowhere
    assert index.choose("postgres") == "a"
    index.database_event("MODIFIED", database(1, None), database(1, "a"))
    assert index.choose("postgres") == "b"
    index.database_event("ADDED", None, database(2, "b"))
    index.database_event("ADDED", None, database(3, "b"))
    assert index.choose("postgres") == "a"  # b is full (2 of 2)
    index.database_event("ADDED", None, database(4, "a"))
    assert index.choose("postgres") is None  # both full: NoCapacity
    index.database_event("DELETED", database(3, "b"), None)
    assert index.choose("postgres") == "b"


def reference_choice(
    shards: dict[str, dict[str, Any]], placed: dict[int, tuple[str, int]], engine: str, limit: int
) -> str | None:
    """The placement rule as documented (and the connection budget), computed from scratch."""
    counts: dict[str, int] = {}
    limits: dict[str, list[int]] = {}
    for name, db_limit in placed.values():
        counts[name] = counts.get(name, 0) + 1
        limits.setdefault(name, []).append(db_limit)
    usable = [
        (counts.get(n, 0), n)
        for n, s in shards.items()
        if (c := ShardCandidate.from_object(s)).engine == engine
        and c.usable(counts.get(n, 0))
        and fits(limit, Commitments.of(limits.get(n, [])), c.connection_budget)
    ]
    return min(usable)[1] if usable else None


@pytest.mark.parametrize("seed", range(20))
def test_agrees_with_the_rule_over_random_event_sequences(seed: int) -> None:
    rng = random.Random(seed)
    index = PlacementIndex(database_shard, LIMIT)
    shards: dict[str, dict[str, Any]] = {}
    placed: dict[int, tuple[str, int]] = {}
    names = [f"s{i:02d}" for i in range(12)]
    limits = [-1, 0, 5, 10, 20, 50]
    for step in range(600):
        roll = rng.random()
        if roll < 0.2:
            name = rng.choice(names)
            new = shard(
                name,
                engine=rng.choice(["postgres", "postgres", "cloudberry"]),
                accepting=rng.random() < 0.8,
                ready=rng.random() < 0.8,
                max_databases=rng.randint(1, 8),
                deleting=rng.random() < 0.05,
                rv=step,
                budget=rng.choice([None, 20, 60, 200]),
            )
            index.shard_event("MODIFIED" if name in shards else "ADDED", shards.get(name), new)
            shards[name] = new
        elif roll < 0.25 and shards:
            name = rng.choice(sorted(shards))
            index.shard_event("DELETED", shards.pop(name), None)
        elif roll < 0.8:
            i = rng.randrange(80)
            target, limit = rng.choice([*names, "unknown"]), rng.choice(limits)
            old = database(i, *placed[i]) if i in placed else None
            index.database_event("MODIFIED" if old else "ADDED", old, database(i, target, limit))
            placed[i] = (target, limit)
        elif placed:
            i = rng.choice(sorted(placed))
            index.database_event("DELETED", database(i, *placed.pop(i)), None)
        limit = rng.choice((5, 50, -1))
        for engine in ("postgres", "cloudberry"):
            expected = reference_choice(shards, placed, engine, limit)
            assert index.choose(engine, limit) == expected, (seed, step, engine, limit)


# -- reservations: exact under a burst -----------------------------------------------------------------


def key(i: int) -> str:
    return f"dbprovider/db{i}.c"


def test_a_reservation_counts_until_the_cache_shows_the_placement() -> None:
    index = index_with([shard("a", max_databases=2), shard("b", max_databases=1)], {})
    assert index.reserve("postgres", key(1)) == "a"
    assert index.reserve("postgres", key(2)) == "b"  # a holds one reservation: b has fewer
    assert index.reserve("postgres", key(3)) == "a"
    assert index.reserve("postgres", key(4)) is None  # 3 of 3 reserved, none placed yet: full
    assert index.reserved() == {key(1): "a", key(2): "b", key(3): "a"}
    index.database_event("MODIFIED", database(1, None), database(1, "a"))  # the write shows: counted once
    assert index.reserved() == {key(2): "b", key(3): "a"}
    assert index.reserve("postgres", key(4)) is None
    index.release(key(3))  # its write was refused
    assert index.reserve("postgres", key(4)) == "a"


def test_a_second_reservation_of_a_database_replaces_its_first() -> None:
    index = index_with([shard("a", max_databases=1), shard("b", max_databases=1)], {})
    assert index.reserve("postgres", key(1)) == "a"
    assert index.reserve("postgres", key(1)) == "a"  # the retry of an unknown outcome: still one slot
    assert index.reserve("postgres", key(2)) == "b"


def test_a_reservation_ends_when_the_database_shows_elsewhere_or_is_deleted() -> None:
    index = index_with([shard("a", max_databases=1), shard("b", max_databases=1)], {})
    assert index.reserve("postgres", key(1)) == "a"
    index.database_event("MODIFIED", database(1, None), database(1, "b"))  # placed by another leader
    assert index.reserved() == {} and index.choose("postgres") == "a"
    assert index.reserve("postgres", key(2)) == "a"
    index.database_event("DELETED", database(2, None), None)
    assert index.reserved() == {} and index.choose("postgres") == "a"


def test_an_unrelated_change_keeps_the_reservation() -> None:
    index = index_with([shard("a", max_databases=1)], {})
    assert index.reserve("postgres", key(1)) == "a"
    index.database_event("MODIFIED", database(1, None), database(1, None))  # e.g. the finalizer added
    assert index.reserved() == {key(1): "a"} and index.choose("postgres") is None


@pytest.mark.parametrize("seed", range(10))
def test_concurrent_placements_never_overfill_a_shard(seed: int) -> None:
    """Workers reserve and write at random, their writes show in the cache late or fail: no shard
    ever holds more than maxDatabases, and every slot a failed write reserved is used after all."""
    rng = random.Random(seed)
    limits = {f"s{i}": rng.randint(1, 6) for i in range(4)}
    index = index_with([shard(n, max_databases=m) for n, m in limits.items()], {})
    placed: dict[str, str] = {}  # what the apiserver holds (the truth)
    lock = threading.Lock()

    def place(i: int, refusals: bool = True) -> None:
        for _attempt in range(5):
            chosen = index.reserve("postgres", key(i))
            if chosen is None:
                return  # NoCapacity: the controller looks again later (below)
            time.sleep(rng.random() / 1000)  # the write's round trip
            if refusals and rng.random() < 0.2:
                index.release(key(i))  # refused (a conflict): the next pass tries again
                continue
            with lock:
                placed[key(i)] = chosen
            time.sleep(rng.random() / 1000)  # the watch event in flight
            index.database_event("MODIFIED", database(i, None), database(i, chosen))
            return

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(place, range(40)))
    # A key that found every shard full while others held reservations they gave back later is
    # placed by its next pass (a NoCapacity pass requeues); without conflicts now.
    for i in range(40):
        if key(i) not in placed:
            place(i, refusals=False)
    per_shard = Counter(placed.values())
    assert all(per_shard[n] <= m for n, m in limits.items()), (per_shard, limits)
    assert sum(per_shard.values()) == sum(limits.values())  # 40 wanted more than there was: all used
    assert index.reserved() == {}


def test_a_reservation_commits_its_connection_limit_until_the_cache_shows_it() -> None:
    """The connection budget is exact under a burst too: a reserved database's limit counts at once."""
    index = index_with([shard("a", max_databases=10, budget=30)], {})
    assert index.reserve("postgres", key(1), 20) == "a"
    assert index.reserve("postgres", key(2), 20) is None  # 20 reserved + 20 > 30, none placed yet
    assert index.reserve("postgres", key(2), 10) == "a"
    index.database_event("MODIFIED", database(1, None), database(1, "a", limit=20))  # the write shows
    assert index.reserved() == {key(2): "a"}
    assert index.choose("postgres", 1) is None  # 20 placed + 10 reserved: the budget is used up
    index.release(key(2))  # its write was refused
    assert index.reserve("postgres", key(3), 10) == "a"


@pytest.mark.parametrize("seed", range(10))
def test_concurrent_placements_never_overcommit_a_budget(seed: int) -> None:
    """Workers reserve databases of random limits and write them late or not at all: the limits
    placed on a shard never add up to more than its connection budget, nor its count over maxDatabases."""
    rng = random.Random(seed)
    budgets = {f"s{i}": rng.randint(10, 60) for i in range(4)}
    index = index_with([shard(n, max_databases=6, budget=b) for n, b in budgets.items()], {})
    limits = {i: rng.choice((5, 10, 20)) for i in range(40)}
    placed: dict[str, str] = {}
    lock = threading.Lock()

    def place(i: int) -> None:
        for _attempt in range(5):
            chosen = index.reserve("postgres", key(i), limits[i])
            if chosen is None:
                return
            time.sleep(rng.random() / 1000)
            if rng.random() < 0.2:
                index.release(key(i))
                continue
            with lock:
                placed[key(i)] = chosen
            time.sleep(rng.random() / 1000)
            index.database_event("MODIFIED", database(i, None), database(i, chosen, limits[i]))
            return

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(place, range(40)))
    committed: Counter[str] = Counter()
    for k, name in placed.items():
        committed[name] += limits[int(k.removeprefix("dbprovider/db").removesuffix(".c"))]
    assert all(committed[n] <= b for n, b in budgets.items()), (committed, budgets)
    assert all(n <= 6 for n in Counter(placed.values()).values())
    assert index.reserved() == {}


def test_a_shard_whose_sql_failed_gets_no_placement_until_a_check_passes() -> None:
    """A Database worker's SQL failed there for a reason not its tenant's: placement stops at once,
    before the Shard's status says anything, and counts it as not Ready (a transient lack, not
    NoCapacity); a passing check gives it back."""
    index = index_with([shard("a"), shard("b")], {"a": 0, "b": 3})
    assert index.choose("postgres") == "a"
    index.suspend("a")
    assert index.choose("postgres") == "b"
    assert index.not_ready("postgres") == ["a"]
    index.shard_event("MODIFIED", shard("a"), shard("a", rv=2))  # a status write changes nothing
    assert index.choose("postgres") == "b"
    index.clear("a")
    assert index.choose("postgres") == "a"
    assert index.not_ready("postgres") == []


def test_a_suspended_shard_that_is_deleted_is_forgotten() -> None:
    index = index_with([shard("a")], {})
    index.suspend("a")
    index.shard_event("DELETED", shard("a"), None)
    index.shard_event("ADDED", None, shard("a", rv=3))
    assert index.choose("postgres") == "a"


def test_a_shard_whose_admin_secret_this_install_may_not_read_is_never_chosen() -> None:
    """Shards are cluster-scoped: another install's Ready Shard, with an admin Secret outside this one's
    shardSecrets, would only fail every SQL step here (AdminSecretInvalid)."""
    config = load_install_config(
        {"tls": {"secretName": "t"}, "shardSecrets": [{"namespace": "dbprovider", "name": "ours-admin"}]}
    )
    index = PlacementIndex(database_shard, LIMIT, config.may_read_admin_secret)
    for name in ("ours", "theirs"):
        index.shard_event("ADDED", None, shard(name))
    for i in range(3):
        index.database_event("ADDED", None, database(i, "ours"))
    assert index.choose("postgres") == "ours"  # the emptier shard is not this install's
    assert index.not_ready("postgres") == []
    index.shard_event("MODIFIED", shard("theirs"), shard("theirs", max_databases=20, rv=2))
    assert [index.reserve("postgres", f"db{i}.c") for i in range(3, 5)] == ["ours", "ours"]


def test_a_move_is_never_offered_a_shard_with_a_pooler() -> None:
    """A DatabaseMove refuses a target whose client endpoint declares a pooler: placement for a move (a
    drain's or `target: any`) skips it, new databases still go there."""
    pooled = shard("a")
    pooled["spec"]["client"]["pooler"] = {"authUser": "_crunchypgbouncer"}
    index = index_with([pooled, shard("b"), shard("c")], {"b": 3, "c": 5})
    assert index.choose("postgres") == "a"
    assert index.reserve("postgres", "move:x/m1", for_move=True, exclude="b") == "c"
    assert index.reserve("postgres", "move:x/m2", for_move=True) == "b"
    assert index.reserve("postgres", "db9.c") == "a"
    index.shard_event("MODIFIED", pooled, shard("a", rv=2))  # the pooler removed: a target again
    assert index.reserve("postgres", "move:x/m3", for_move=True, exclude="b") == "a"
