"""A pass that finds the cache behind its own last write reads the object live instead of redoing work.

The Database informer is stopped after its first sync, so it never sees the controller's writes:
the worst case of a watch event in flight. Runs as the provider's ServiceAccount on the real
apiserver and PostgreSQL 18 with its statement log.
"""

from __future__ import annotations

from datetime import UTC, datetime

from informers import SECRETS, Informer, Rest
from reconciler.database import DatabaseController
from reconciler.events import EventRecorder
from reconciler.resources import DATABASES, SHARDS
from tests.generator.kubeapi import wait_for
from tests.reconciler.conftest import NAMESPACE, install_config, provisioner_statements


def test_a_pass_on_a_lagging_cache_runs_no_sql_and_writes_nothing(logged_pg, fleet, provider_client, admin_rest):
    shard = fleet.shard(logged_pg)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "test", "lastTransitionTime": now}
    admin_rest.patch(SHARDS, shard, {"status": {"conditions": [ready]}}, subresource="status")
    name = fleet.database("lagging")
    key = f"{NAMESPACE}/{name}"

    rest = Rest(provider_client)
    shards = Informer(rest, SHARDS).start()
    databases = Informer(rest, DATABASES, NAMESPACE).start()
    secrets = Informer(rest, SECRETS, NAMESPACE).start()
    events = EventRecorder(rest, "test")
    try:
        wait_for(lambda: (shards.get(shard) or {}).get("status", {}).get("conditions"), what="the Ready shard cached")
        wait_for(lambda: databases.get(key), what="the database cached")
        controller = DatabaseController(rest, install_config(), NAMESPACE, databases, shards, secrets, events,
                                        admin_host_override="127.0.0.1")
        databases.stop()  # from here on, the cache shows the database as created, never the writes

        assert controller.reconcile(key) is None  # places, writes the Secret, provisions: Ready
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
    finally:
        events.close()
        for informer in (shards, databases, secrets):
            informer.stop()
