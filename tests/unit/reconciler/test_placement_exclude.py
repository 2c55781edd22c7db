"""A move's `target: any`: the PlacementIndex reserves a shard other than the database's own, and the
reservation (under the move's key) counts until the move gives it back."""

from __future__ import annotations

import copy
from typing import Any

from domain.resources import database_shard
from reconciler.placement_index import PlacementIndex
from tests.unit.reconciler.test_shard_suspects import SHARD


def shard(name: str, max_databases: int = 5) -> dict[str, Any]:
    made = copy.deepcopy(SHARD)
    made["metadata"]["name"] = name
    made["spec"]["maxDatabases"] = max_databases
    return made


def test_the_source_is_never_chosen_and_the_reservation_counts_until_released() -> None:
    index = PlacementIndex(database_shard)
    index.shard_event("ADDED", None, shard("a"))
    index.shard_event("ADDED", None, shard("b", max_databases=1))
    assert index.choose("postgres") == "a"
    assert index.reserve("postgres", "move:ns/m1", exclude="a") == "b"
    assert index.reserved() == {"move:ns/m1": "b"}
    assert index.reserve("postgres", "move:ns/m2", exclude="a") is None  # b is full with the first move
    index.release("move:ns/m1")
    assert index.reserve("postgres", "move:ns/m2", exclude="a") == "b"


def test_a_held_choice_counts_again_after_a_restart() -> None:
    index = PlacementIndex(database_shard)
    index.shard_event("ADDED", None, shard("b", max_databases=1))
    index.hold("move:ns/m1", "b")
    index.hold("move:ns/m1", "b")  # every pass holds it; counted once
    assert index.reserved() == {"move:ns/m1": "b"} and index.choose("postgres") is None
    index.release("move:ns/m1")
    assert index.choose("postgres") == "b"
