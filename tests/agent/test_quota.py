"""A consumer at its quota (the install's Consumer maxDatabases): one more claim shows QuotaExceeded, costs
nothing and breaks nothing, and gets its database once a claim of the consumer is deleted and its database
dropped (the suite's retention is 30 s)."""

from __future__ import annotations

from dbprovider.devstack import DevStack
from domain.naming import claim_database_id
from domain.resources import CLAIMS, CONSUMERS
from harness import KubeControlPlane
from informers import Rest
from tests.agent.conftest import POLL_SECONDS, Consumer, Provider
from tests.agent.test_agent import decoded, logs_in, no_delete_pending, provider_databases, ready_claim
from tests.agent.test_polling import consumer_requests
from tests.support.common import unique, wait_for


def requests_seen(provider: Provider, stack: DevStack, method: str, status: int | None = None) -> int:
    """How many of the consumer's requests with this method (and answer) the provider logged."""
    seen = consumer_requests(provider, stack.consumer)
    return sum(1 for r in seen if r["method"] == method and status in (None, r["status"]))


def test_a_claim_over_the_quota_waits_and_proceeds_once_a_database_is_deleted(
    consumer: Consumer, provider: Provider, stack: DevStack, kube: KubeControlPlane
) -> None:
    no_delete_pending(stack)  # an earlier test's drop would free a slot while this one runs
    counted = len(provider_databases(stack))
    with kube.admin_client() as client:
        rest = Rest(client)
        original = rest.get(CONSUMERS, stack.consumer)["spec"].get("maxDatabases")
        rest.patch(CONSUMERS, stack.consumer, {"spec": {"maxDatabases": counted + 1}})
        try:
            first, first_values = ready_claim(consumer)  # the last free slot
            second = consumer.claim(unique("quota"))
            meta = second["metadata"]
            wait_for(lambda: consumer.condition(second, "Ready").get("reason") == "QuotaExceeded", 60, "QuotaExceeded")
            status = (consumer.get_claim(second) or {})["status"]
            assert status["phase"] == "Pending" and "binding" not in status
            assert consumer.condition(second, "ProviderReachable")["status"] == "True"
            assert consumer.secret(meta["namespace"], meta["name"]) is None

            # It waits without asking again while nothing changed, and nothing else is touched.
            asked = requests_seen(provider, stack, "PUT", 429)
            polls = requests_seen(provider, stack, "GET")
            wait_for(lambda: requests_seen(provider, stack, "GET") >= polls + 3, 10 * POLL_SECONDS, "three more polls")
            assert requests_seen(provider, stack, "PUT", 429) == asked
            assert len(provider_databases(stack)) == counted + 1
            assert all(db["deleteRequestedAt"] is None for db in provider_databases(stack))
            first_secret = consumer.secret(first["metadata"]["namespace"], first["metadata"]["name"])
            assert first_secret is not None and decoded(first_secret) == first_values
            assert consumer.condition(first, "Ready")["status"] == "True"
            assert logs_in(first_values) == first_values["username"]

            # Deleting a claim frees its slot once its database is dropped; the waiting claim then proceeds.
            consumer.admin.delete(CLAIMS, first["metadata"]["name"], first["metadata"]["namespace"])
            consumer.wait_condition(second, "Ready", "True", timeout=180)
            secret = consumer.secret(meta["namespace"], meta["name"])
            assert secret is not None
            values = decoded(secret)
            assert logs_in(values) == values["username"]
            db_id = claim_database_id(meta["namespace"], meta["name"])
            assert db_id in {db["externalId"] for db in provider_databases(stack)}
        finally:
            rest.patch(CONSUMERS, stack.consumer, {"spec": {"maxDatabases": original}})
