"""Placement spreads by count, skips unusable shards, never mixes engines, and is deterministic.

The index is fed the informers' events (ADDED/MODIFIED/DELETED with old and new objects) the way
`Informer` delivers them; its wiring to real informers on the apiserver is covered by the
reconciler suite (spread, skips, NoCapacity).
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

import pytest

from domain.config import load_install_config
from domain.connection_budget import Commitments, database_limit, fits
from reconciler.placement import PlacementIndex, ShardCandidate
from reconciler.resources import database_shard

READY = [{"type": "Ready", "status": "True", "reason": "Ok"}]
NOT_READY = [{"type": "Ready", "status": "False", "reason": "Unreachable"}]


def shard(name: str, *, engine: str = "postgres", accepting: bool = True, ready: bool = True,
          max_databases: int = 10, deleting: bool = False, rv: int = 1, budget: int | None = 1000) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    cluster = {"keldonCluster" if engine == "cloudberry" else "perconaCluster": {"namespace": "pg", "name": name}}
    admin = {"serviceName": f"{name}-primary", "secretRef": {"namespace": "dbprovider", "name": f"{name}-admin"}}
    return {"metadata": meta,
            "spec": {"engine": engine, "accepting": accepting, "maxDatabases": max_databases, **cluster,
                     "admin": admin, "client": {"host": f"{name}.example.com"}},
            "status": {"conditions": READY if ready else NOT_READY,
                       **({"connectionBudget": budget} if budget is not None else {})}}


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
    """The rule as written in the operator guide (and the connection budget), computed from scratch."""
    counts: dict[str, int] = {}
    limits: dict[str, list[int]] = {}
    for name, db_limit in placed.values():
        counts[name] = counts.get(name, 0) + 1
        limits.setdefault(name, []).append(db_limit)
    usable = [(counts.get(n, 0), n) for n, s in shards.items()
              if (c := ShardCandidate.from_object(s)).engine == engine and c.usable(counts.get(n, 0))
              and fits(limit, Commitments.of(limits.get(n, [])), c.connection_budget)]
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
            new = shard(name, engine=rng.choice(["postgres", "postgres", "cloudberry"]),
                        accepting=rng.random() < 0.8, ready=rng.random() < 0.8,
                        max_databases=rng.randint(1, 8), deleting=rng.random() < 0.05, rv=step,
                        budget=rng.choice([None, 20, 60, 200]))
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
