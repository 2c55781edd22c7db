"""The agent process: two watches, a Lease, and a pass loop.

    agent = Agent(rest, provider, AgentOptions(namespace="dbprovider-agent")).start()
    ...
    agent.stop()

Watches: one on DatabaseClaims, one on the Secrets the agent wrote (label-selected), whatever the
number of claims. Only the replica holding the Lease `<lease_name>` runs passes (agent.sync). A pass
runs every `poll_interval`, at once when a claim's spec, annotations or deletion change or one of the
agent's Secrets is changed or deleted by someone else (events within `min_gap` are folded into one pass),
sooner (`retry_interval`) while a claim waits for something that comes within seconds, and, while the
provider is away, after a jittered exponential backoff that is never shorter than its Retry-After.
The leader writes when it last heard from the provider onto the Lease (annotation
db.bnerd.com/last-sync) with its renewals; `alive()` and `ready()` are the probes' answers.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from agent.binding import OWNED_SECRETS_SELECTOR
from agent.events import ClaimEvents
from agent.metrics import AgentMetrics, ClaimsCollector
from agent.provider import Provider
from agent.sync import PassResult, Syncer
from domain.cached import without_bookkeeping
from domain.constants import ANNOTATION_AGENT_LAST_SYNC
from domain.resources import CLAIMS
from domain.timefmt import format_time
from informers import SECRETS, Rest, SharedInformers
from informers.leader import LeaderElector, default_identity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentOptions:
    """Where the Lease is, what is watched, and the loop's timings (seconds)."""

    namespace: str  # the agent's own namespace: its Lease
    lease_name: str = "dbprovider-agent"
    watch_namespace: str | None = None  # None: claims in every namespace
    poll_interval: float = 30.0
    retry_interval: float = 5.0
    min_gap: float = 1.0
    max_backoff: float = 300.0
    leader_election: bool = True
    identity: str | None = None
    stall_after: float = 600.0  # a pass running longer than this (a hung call) fails the liveness probe


def backoff(failures: int, base: float, cap: float, retry_after: float | None) -> float:
    """Exponential in `failures`, jittered to 50-150 % (replicas of many clusters do not retry in step),
    capped, and never below the provider's Retry-After."""
    delay = min(cap, base * 2.0 ** max(0, failures - 1)) * random.uniform(0.5, 1.5)
    return max(delay, retry_after or 0.0)


class Agent:
    def __init__(
        self, rest: Rest, provider: Provider, options: AgentOptions, metrics: AgentMetrics | None = None
    ) -> None:
        self.rest = rest
        self.provider = provider
        self.options = options
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.identity = options.identity or default_identity()
        # Its claims and the Secrets it writes, whole (less bookkeeping): not the provider's cached forms.
        self.informers = SharedInformers(rest, forms=lambda _resource: without_bookkeeping)
        self.claims = self.informers.informer(CLAIMS, options.watch_namespace)
        self.secrets = self.informers.informer(SECRETS, options.watch_namespace, label_selector=OWNED_SECRETS_SELECTOR)
        events = ClaimEvents(rest, self.identity)
        self.syncer = Syncer(rest, self.claims, self.secrets, provider, events, metrics=self.metrics)
        self.metrics.registry.register(ClaimsCollector(self.claims.list))
        self.metrics.leader.set_function(lambda: 1.0 if self.is_leading() else 0.0)
        self.passes = 0
        self._pass_started: float | None = None  # monotonic start of the pass running now
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.elector: LeaderElector | None = None
        if options.leader_election:
            self.elector = LeaderElector(
                rest,
                options.namespace,
                options.lease_name,
                identity=self.identity,
                on_started_leading=self._wake.set,
                annotations=self._lease_annotations,
            )
        self.claims.add_handler(self._on_claim)
        self.secrets.add_handler(self._on_secret)

    def start(self) -> Agent:
        self.informers.start()
        if self.elector is not None:
            self.elector.start()
        self._thread = threading.Thread(target=self._loop, name="agent-passes", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.elector is not None:
            self.elector.stop()
        self.informers.stop()
        self.provider.close()

    def is_leading(self) -> bool:
        return self.elector is None or self.elector.is_leading()

    def ready(self) -> bool:
        """The readiness probe: the caches of claims and Secrets are synced."""
        return self.informers.has_synced()

    def alive(self) -> bool:
        """The liveness probe: the pass loop runs, and no pass has been hanging for `stall_after`."""
        started = self._pass_started
        stalled = started is not None and time.monotonic() - started > self.options.stall_after
        return self._thread is not None and self._thread.is_alive() and not stalled

    def _lease_annotations(self) -> dict[str, str]:
        last = self.syncer.last_sync
        return {ANNOTATION_AGENT_LAST_SYNC: format_time(last)} if last is not None else {}

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        failures = 0
        delay = 0.0
        while not self._stop.is_set():
            self._wake.wait(delay)
            if self._stop.is_set():
                return
            self._wake.clear()
            if not (self.is_leading() and self.ready()):
                delay = self.options.retry_interval
                continue
            result = self._pass()
            if not result.reachable:
                failures += 1
                delay = backoff(failures, self.options.retry_interval, self.options.max_backoff, result.retry_after)
                log.info("provider unreachable; next try in %.1f s", delay)
            else:
                failures = 0
                delay = self.options.retry_interval if result.again_soon else self.options.poll_interval
            self._stop.wait(self.options.min_gap)  # fold the events of this pass's own writes into the next

    def _pass(self) -> PassResult:
        self.passes += 1
        self._pass_started = time.monotonic()
        try:
            result = self.syncer.run_pass()
        except Exception:  # a bug must not end the loop: logged, and the next pass comes soon
            log.exception("agent pass failed")
            self.metrics.passes.labels(outcome="failed").inc()
            return PassResult(again_soon=True)
        finally:
            self._pass_started = None
        self.metrics.passes.labels(outcome="synced" if result.reachable else "provider_away").inc()
        return result

    # -- wake-ups --------------------------------------------------------------------------------

    def _on_claim(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old is None or new is None or _meaningful(old) != _meaningful(new):
            self._wake.set()

    def _on_secret(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None or (old is not None and old.get("data") != new.get("data")):
            self._wake.set()


def _meaningful(claim: dict[str, Any]) -> tuple[Any, ...]:
    """What of a claim asks for a pass: its spec generation, annotations, deletion (not its status)."""
    meta = claim.get("metadata") or {}
    return (meta.get("generation"), meta.get("annotations"), meta.get("deletionTimestamp"))
