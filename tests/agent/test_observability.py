"""What a consumer cluster's SRE sees of the agent: its probes and /metrics scraped from the running
process, when it last heard from the provider on its Lease; and at rest, however long since the last
change, a pass writes nothing to a claim."""

from __future__ import annotations

from datetime import timedelta

import requests
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.binding import OWNED_SECRETS_SELECTOR
from agent.events import ClaimEvents
from agent.metrics import AgentMetrics
from agent.provider import Provider
from agent.sync import Syncer, utcnow
from dbprovider.devstack import DevStack
from domain.cached import without_bookkeeping
from domain.constants import ANNOTATION_AGENT_LAST_SYNC
from domain.resources import CLAIMS
from domain.timefmt import parse_time
from informers import LEASES, SECRETS, Rest, SharedInformers
from tests.agent.conftest import AGENT_NAMESPACE, Consumer
from tests.agent.test_agent import ready_claim
from tests.support.common import wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parsed(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(consumer: Consumer) -> Samples:
    response = requests.get(f"{consumer.endpoint}/metrics", timeout=10)
    assert response.status_code == 200
    return parsed(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def synced_passes(consumer: Consumer) -> float:
    return value(scrape(consumer), "dbprovider_agent_passes_total", outcome="synced")


def wait_passes(consumer: Consumer, count: int) -> None:
    """Until the agent ran `count` more passes that heard from the provider."""
    target = synced_passes(consumer) + count
    wait_for(lambda: synced_passes(consumer) >= target, 60, f"{count} more passes", max_interval=0.5)


def answers(url: str) -> int | None:
    """The HTTP status of a GET, None while nothing listens."""
    try:
        return requests.get(url, timeout=10).status_code
    except requests.ConnectionError:
        return None


def test_the_agent_serves_probes_and_metrics_of_its_claims(consumer: Consumer) -> None:
    for path in ("/healthz", "/readyz"):
        wait_for(lambda p=path: answers(consumer.endpoint + p) == 200, 60, path)
    claim, _ = ready_claim(consumer)
    wait_passes(consumer, 1)
    samples = scrape(consumer)
    assert value(samples, "dbprovider_agent_leader") == 1
    assert value(samples, "dbprovider_agent_claims", phase="Ready") >= 1
    ready = value(samples, "dbprovider_agent_claim_conditions", type="Ready", status="True", reason="Ready")
    assert ready >= 1
    assert value(samples, "dbprovider_agent_provider_requests_total", route="PUT /v1/databases/{id}", outcome="201")
    assert value(samples, "dbprovider_agent_provider_requests_total", route="GET /v1/databases", outcome="304")
    assert value(samples, "dbprovider_agent_secret_writes_total", action="create") >= 1
    last_sync = value(samples, "dbprovider_agent_last_sync_timestamp_seconds")
    assert last_sync >= parse_time(claim["metadata"]["creationTimestamp"]).timestamp()  # type: ignore[union-attr]
    assert not any(claim["metadata"]["name"] in repr(key) for key in samples)  # no per-claim series


def test_at_rest_a_claim_is_not_written_while_the_lease_shows_the_last_sync(consumer: Consumer) -> None:
    claim, _ = ready_claim(consumer)
    wait_passes(consumer, 2)  # the passes that follow the claim's last change
    before = consumer.get_claim(claim)
    assert before is not None
    lease = consumer.admin.get(LEASES, "dbprovider-agent", AGENT_NAMESPACE)
    first = parse_time(lease["metadata"]["annotations"][ANNOTATION_AGENT_LAST_SYNC])
    assert first is not None

    def later_sync() -> bool:
        current = consumer.admin.get(LEASES, "dbprovider-agent", AGENT_NAMESPACE)
        seen = parse_time(current["metadata"]["annotations"][ANNOTATION_AGENT_LAST_SYNC])
        return seen is not None and seen > first

    wait_for(later_sync, 60, "a later last-sync on the Lease", max_interval=0.5)
    after = consumer.get_claim(claim)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["status"]["lastSyncTime"] == before["status"]["lastSyncTime"]


def test_a_pass_long_after_the_last_change_writes_nothing(consumer: Consumer, stack: DevStack) -> None:
    """A second agent's pass an hour later (a restarted agent, a new leader): the claim and its Secret at
    the provider's values need no write, whatever lastSyncTime says."""
    claim, _ = ready_claim(consumer)
    namespace = claim["metadata"]["namespace"]
    wait_passes(consumer, 2)
    before = consumer.get_claim(claim)
    assert before is not None
    metrics = AgentMetrics()
    with consumer.kube.admin_client() as client:
        rest = Rest(client)
        informers = SharedInformers(rest, forms=lambda _resource: without_bookkeeping)
        claims = informers.informer(CLAIMS, namespace)
        secrets = informers.informer(SECRETS, namespace, label_selector=OWNED_SECRETS_SELECTOR)
        provider = Provider(stack.api_url, consumer.token_file, stack.ca_file)
        informers.start()
        try:
            wait_for(informers.has_synced, 30, "the caches")
            later = lambda: utcnow() + timedelta(hours=1)  # noqa: E731
            syncer = Syncer(rest, claims, secrets, provider, ClaimEvents(rest, "test"), clock=later, metrics=metrics)
            assert syncer.run_pass().reachable
        finally:
            informers.stop()
            provider.close()
    samples = parsed(generate_latest(metrics.registry).decode())
    assert value(samples, "dbprovider_agent_claim_status_writes_total") == 0
    assert sum(v for (name, _), v in samples.items() if name == "dbprovider_agent_secret_writes_total") == 0
    after = consumer.get_claim(claim)
    assert after is not None and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
