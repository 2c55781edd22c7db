"""A claim deleted while the agent's last list of the provider lacks its database (a create whose answer
was lost, a list answered by a provider replica whose cache is behind): the agent still sends the DELETE,
so the database is not left behind at the provider when the claim goes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests

from agent.binding import OWNED_SECRETS_SELECTOR
from agent.events import ClaimEvents
from agent.provider import ListAnswer, Provider
from agent.sync import Syncer
from dbprovider.devstack import DevStack
from domain.cached import without_bookkeeping
from domain.constants import FINALIZER_CLAIM
from domain.resources import CLAIMS
from informers import SECRETS, Rest, SharedInformers
from tests.agent.conftest import Consumer
from tests.agent.test_agent import provider_view
from tests.support.common import unique, wait_for


class BehindReplica(Provider):
    """The real provider, but its list is one taken before the database was created (a replica behind)."""

    def __init__(self, stack: DevStack, consumer: Consumer, earlier: ListAnswer) -> None:
        super().__init__(stack.api_url, consumer.token_file, stack.ca_file)
        self.earlier = earlier

    def list(self, etag: str | None) -> ListAnswer:
        return self.earlier


@contextmanager
def agent_paused(consumer: Consumer) -> Iterator[None]:
    """The suite's agent process stopped (SIGSTOP) so that only this test's pass handles the claim."""
    os.kill(consumer.agent.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(consumer.agent.pid, signal.SIGCONT)


def test_a_claim_deleted_while_the_last_list_lacks_its_database_still_deletes_it(
    consumer: Consumer, stack: DevStack
) -> None:
    namespace, db_id = unique("gone"), unique("late")
    with consumer.kube.admin_client() as client:
        rest = Rest(client)
        informers = SharedInformers(rest, forms=lambda _resource: without_bookkeeping)
        claims = informers.informer(CLAIMS, namespace)
        secrets = informers.informer(SECRETS, namespace, label_selector=OWNED_SECRETS_SELECTOR)
        real = Provider(stack.api_url, consumer.token_file, stack.ca_file)
        earlier = real.list(None)  # the consumer's databases before this test's one is created
        assert earlier.items is not None and db_id not in earlier.items
        behind = BehindReplica(stack, consumer, earlier)
        with agent_paused(consumer):
            created = requests.put(
                f"{stack.api_url}/v1/databases/{db_id}",
                json={},
                headers={"Authorization": f"Bearer {stack.token}"},
                verify=str(stack.ca_file),
                timeout=10,
            )
            assert created.status_code == 201, created.text
            claim = consumer.claim(namespace, {"databaseId": db_id})
            meta = claim["metadata"]
            rest.patch(CLAIMS, meta["name"], {"metadata": {"finalizers": [FINALIZER_CLAIM]}}, namespace)
            consumer.admin.delete(CLAIMS, meta["name"], namespace)
            informers.start()
            try:
                wait_for(informers.has_synced, 30, "the caches")
                deleting = lambda: any((c.get("metadata") or {}).get("deletionTimestamp") for c in claims.list())  # noqa: E731
                wait_for(deleting, 30, "the claim deleting in the cache")
                syncer = Syncer(rest, claims, secrets, behind, ClaimEvents(rest, "test"))
                assert syncer.run_pass().reachable
            finally:
                informers.stop()
                behind.close()
                real.close()
        wait_for(lambda: consumer.get_claim(claim) is None, 30, "the claim gone", max_interval=0.5)

        def delete_requested() -> dict[str, Any] | None:
            view = provider_view(stack, db_id)
            return view if view["deleteRequestedAt"] is not None else None

        wait_for(delete_requested, 30, "deleteRequestedAt at the provider", max_interval=0.5)
        # dropAfter comes with the soft delete's disable, which waits for a create still provisioning.
        wait_for(lambda: provider_view(stack, db_id)["dropAfter"], 90, "the soft delete's dropAfter", max_interval=0.5)
