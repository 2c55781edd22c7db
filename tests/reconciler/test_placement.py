"""Placement spreads by count, skips unusable shards, never mixes engines, and is deterministic."""

from __future__ import annotations

import pytest

from reconciler.placement import ShardCandidate, choose_shard


def shard(name: str, **overrides: object) -> ShardCandidate:
    values = {"name": name, "engine": "postgres", "accepting": True, "ready": True, "max_databases": 10}
    values.update(overrides)
    return ShardCandidate(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shards", "counts", "engine", "expected"),
    [
        pytest.param([shard("a"), shard("b")], {"a": 3, "b": 1}, "postgres", "b", id="fewest-databases"),
        pytest.param([shard("b"), shard("a")], {"a": 2, "b": 2}, "postgres", "a", id="tie-smallest-name"),
        pytest.param([shard("a", accepting=False), shard("b")], {"b": 9}, "postgres", "b", id="skips-draining"),
        pytest.param([shard("a", ready=False), shard("b")], {"b": 5}, "postgres", "b", id="skips-not-ready"),
        pytest.param([shard("a"), shard("b")], {"a": 10, "b": 10}, "postgres", None, id="all-full-no-capacity"),
        pytest.param([shard("a", max_databases=1)], {"a": 0}, "postgres", "a", id="max-one-empty"),
        pytest.param([shard("a", being_deleted=True)], {}, "postgres", None, id="skips-deleting-shard"),
        pytest.param([shard("a", engine="cloudberry"), shard("b")], {}, "cloudberry", "a", id="engine-match"),
        pytest.param([shard("a"), shard("b")], {}, "cloudberry", None, id="never-mixes-engines"),
        pytest.param([], {}, "postgres", None, id="no-shards"),
        pytest.param([shard("a", max_databases=5), shard("b")], {"a": 4, "b": 4}, "postgres", "a", id="below-limit"),
    ],
)
def test_choose_shard(shards, counts, engine, expected) -> None:
    assert choose_shard(shards, counts, engine) == expected


def test_from_object_reads_spec_and_ready_condition() -> None:
    obj = {
        "metadata": {"name": "shard01"},
        "spec": {"maxDatabases": 200, "accepting": False},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ok"}]},
    }
    candidate = ShardCandidate.from_object(obj)
    assert candidate == ShardCandidate("shard01", "postgres", False, True, 200)
    obj["status"]["conditions"][0]["status"] = "False"
    assert ShardCandidate.from_object(obj).ready is False
    assert ShardCandidate.from_object({"metadata": {"name": "x"}, "spec": {}}).ready is False
