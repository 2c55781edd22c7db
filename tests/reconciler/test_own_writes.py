"""A pass that finds the cache behind its own last write reads the object live instead of redoing work.

The Database informer is stopped after its first sync, so it never sees the controller's writes:
the worst case of a watch event in flight. Runs as the provider's ServiceAccount on the real
apiserver and PostgreSQL 18 with its statement log.
"""

from __future__ import annotations

from reconciler.resources import SHARDS
from tests.reconciler.conftest import NAMESPACE, controller_parts, provisioner_statements
from tests.support.common import now_stamp, wait_for


def test_a_pass_on_a_lagging_cache_runs_no_sql_and_writes_nothing(logged_pg, fleet, provider_client, admin_rest):
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
        assert controller.reconcile(key) is None  # reads past the cache: writes the Secret, provisions: Ready
        ready_db = fleet.get_database(name)
        assert ready_db["status"]["phase"] == "Ready"
        wait_for(lambda: secrets.get(f"{NAMESPACE}/{name}-credentials"), what="the Secret cached")
        before = len(provisioner_statements(logged_pg))

        # Woken by its own writes' events, with the cache still at "created, not placed".
        assert databases.get(key)["metadata"]["resourceVersion"] != ready_db["metadata"]["resourceVersion"]
        assert controller.reconcile(key) is None
        assert controller.reconcile(key) is None
        assert provisioner_statements(logged_pg)[before:] == []  # not placed or provisioned again
        after = fleet.get_database(name)
        assert after["metadata"]["resourceVersion"] == ready_db["metadata"]["resourceVersion"]  # nothing written
        assert after["status"]["shard"] == shard
