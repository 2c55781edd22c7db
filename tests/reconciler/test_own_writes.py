"""A pass that finds the cache behind its own last write does no work: it waits for the write's watch event
(which wakes the key), and only a cache that still lags after CACHE_LAG_WAIT is read past, live.

The Database informer is stopped after its first sync, so it never sees the controller's writes:
the worst case of a watch event in flight. Runs as the provider's ServiceAccount on the real
apiserver and PostgreSQL 18 with its statement log.
"""

from __future__ import annotations

import time

import pytest

from domain.resources import SHARDS
from reconciler.database import writes
from tests.reconciler.conftest import NAMESPACE, controller_parts, provisioner_statements
from tests.support.common import now_stamp, wait_for


def test_a_pass_on_a_lagging_cache_runs_no_sql_and_writes_nothing(
    logged_pg, fleet, provider_client, admin_rest, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(writes, "CACHE_LAG_WAIT", 0.5)
    shard = fleet.shard(logged_pg)
    now = now_stamp()
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "test", "lastTransitionTime": now}
    admin_rest.patch(SHARDS, shard, {"status": {"conditions": [ready], "connectionBudget": 1000}}, subresource="status")
    name = fleet.database("lagging")
    key = f"{NAMESPACE}/{name}"

    with controller_parts(provider_client) as parts:
        shards, databases, secrets = parts.shards, parts.databases, parts.secrets
        wait_for(lambda: (shards.get(shard) or {}).get("status", {}).get("conditions"), what="the Ready shard cached")
        wait_for(lambda: databases.get(key), what="the database cached")
        controller = parts.controller()
        databases.stop()  # from here on, the cache shows the database as created, never the writes

        assert controller.reconcile(key) is None  # places (no SQL in a placement pass)
        assert fleet.get_database(name)["status"]["shard"] == shard
        assert controller.lane(key) == shard  # its next pass runs in the shard's lane, cache or not
        placed = fleet.get_database(name)
        before = len(provisioner_statements(logged_pg))
        waiting = controller.reconcile(key)  # the cache lags the placement: wait for its event, do nothing
        assert waiting is not None and 0 < waiting.requeue_after <= writes.CACHE_LAG_WAIT
        assert provisioner_statements(logged_pg)[before:] == []
        assert fleet.get_database(name)["metadata"]["resourceVersion"] == placed["metadata"]["resourceVersion"]
        time.sleep(waiting.requeue_after)
        assert controller.reconcile(key) is None  # still lagging: reads past the cache, provisions: Ready
        ready_db = fleet.get_database(name)
        assert ready_db["status"]["phase"] == "Ready"
        wait_for(lambda: secrets.get(f"{NAMESPACE}/{name}-credentials"), what="the Secret cached")
        before = len(provisioner_statements(logged_pg))

        # Woken by its own writes' events, with the cache still at "created, not placed".
        assert databases.get(key)["metadata"]["resourceVersion"] != ready_db["metadata"]["resourceVersion"]
        assert controller.reconcile(key) is not None  # waits for the event of its write
        time.sleep(writes.CACHE_LAG_WAIT)
        assert controller.reconcile(key) is None  # reads past the cache: Ready, nothing to do
        assert provisioner_statements(logged_pg)[before:] == []  # not placed or provisioned again
        after = fleet.get_database(name)
        assert after["metadata"]["resourceVersion"] == ready_db["metadata"]["resourceVersion"]  # nothing written
        assert after["status"]["shard"] == shard
