"""Placement and a drain: a draining shard takes no new database, and a move's reservation on its target
counts against the target's maxDatabases like a placement's, also when taken up again after a restart."""

from __future__ import annotations

import copy
from typing import Any

from domain.resources import database_shard
from reconciler.placement_index import PlacementIndex
from tests.unit.reconciler.test_shard_suspects import SHARD


def shard(name: str, max_databases: int, *, drain: bool = False) -> dict[str, Any]:
    obj = copy.deepcopy(SHARD)
    obj["metadata"]["name"] = name
    obj["spec"] |= {"maxDatabases": max_databases, "drain": drain, "perconaCluster": {"namespace": "pg", "name": name}}
    return obj


def test_a_draining_shard_is_never_chosen_and_a_move_holds_its_target() -> None:
    placement = PlacementIndex(database_shard)
    placement.shard_event("ADDED", None, shard("a", 5, drain=True))  # empty, but draining
    placement.shard_event("ADDED", None, shard("b", 2))
    assert placement.choose("postgres") == "b"
    assert placement.reserve("postgres", "move:ns/one") == "b"
    placement.hold("move:ns/two", "b")  # a running move found after a restart
    placement.hold("move:ns/two", "b")  # taken up once only
    assert placement.choose("postgres") is None  # b is full: 2 of 2
    assert placement.not_ready("postgres") == []  # a lack of capacity, not a shard down

    placement.release("move:ns/two")
    assert placement.choose("postgres") == "b"
    placement.shard_event("MODIFIED", None, shard("a", 5))  # drain set back to false
    assert placement.choose("postgres") == "a"
