"""A shard suspected right after a check (a statement failed or hangs less than MIN_FORCED_GAP after it) is
checked again once that gap is over, and placement comes back to it when that check passes: the suspicion
is not dropped with the cached result, which would keep the shard out of placement until its next
periodic check."""

from __future__ import annotations

from domain.constants import ShardReason
from domain.resources import database_shard
from domain.specs import ShardSpec
from reconciler.placement_index import PlacementIndex
from reconciler.shard.controller import MIN_FORCED_GAP, Health, ShardController
from reconciler.shard.suspects import ShardSuspects
from tests.unit.reconciler.test_invalid_shard_spec import READY, Cache, RecordingRest

SHARD = {
    "metadata": {"name": "a", "generation": 1, "resourceVersion": "3"},
    "spec": {
        "maxDatabases": 5,
        "perconaCluster": {"namespace": "pg", "name": "a"},
        "admin": {"serviceName": "a-primary", "secretRef": {"namespace": "pg", "name": "a-admin"}},
        "client": {"host": "a.example.com"},
    },
    "status": {"conditions": [READY], "connectionBudget": 100},
}


class CountingChecks(ShardController):
    """Its checks pass without connecting; counted."""

    checks = 0

    def check(self, name: str, spec: ShardSpec) -> Health:
        self.checks += 1
        return Health(ShardReason.OK, "admin connection healthy", "17.2")


def test_a_suspicion_right_after_a_check_is_checked_once_the_gap_is_over() -> None:
    placement = PlacementIndex(database_shard)
    placement.shard_event("ADDED", None, SHARD)
    suspects = ShardSuspects(placement=placement)
    controller = CountingChecks(RecordingRest(), Cache(SHARD), Cache(), suspects=suspects, ping_interval=60.0)  # type: ignore[arg-type]
    controller.reconcile("a")
    assert controller.checks == 1 and placement.choose("postgres") == "a"

    suspects.suspect("a")  # a statement failed just after that check
    assert placement.choose("postgres") is None
    result = controller.reconcile("a")
    assert controller.checks == 1  # within MIN_FORCED_GAP: the last result stands ...
    assert result is not None and result.requeue_after == MIN_FORCED_GAP  # ... and the check is owed
    assert placement.choose("postgres") is None

    when, generation, health = controller._last["a"]
    controller._last["a"] = (when - MIN_FORCED_GAP, generation, health)  # the gap is over
    result = controller.reconcile("a")
    assert controller.checks == 2 and placement.choose("postgres") == "a"
    assert result is not None and result.requeue_after > MIN_FORCED_GAP
