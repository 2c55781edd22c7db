"""The Shard controller: is the shard's admin connection usable, and how many databases it holds.

Pings every Ready shard every 15 s (PING_INTERVAL; in a fleet of more than 45 shards less often, up to
60 s from 180 shards, the longest a rotated or broken admin Secret may take to show on the Shard:
SETTINGS.shard_checks.ready_interval_for) and a shard that is not Ready every 5 s (NOT_READY_RECHECK), so
a failure is seen and a recovery taken up well within that minute; also whenever the Shard or one of its
Databases changes (a Ready shard at most every 10 s: a burst of placements must not ping once per
database, or one starts or stops waiting on a failed login at the client endpoint: ClientLoginFailing,
reconciler.shard.client_logins), and at once when a Database worker's SQL on it failed or hangs (`suspects`).
Each ping opens a NEW admin connection and closes it: a reused
session would keep answering while the postmaster accepts no new connections (stopped, out of
slots), which no consumer could then use. Shards are checked concurrently (the controller's
workers), so dead shards do not delay the others.

A ping passes when the provisioner logs in, its role fits (provisioner.dialect_problem) and the
server can write (shard_probe.Writability: not a standby, new sessions not read-only; and, once a
Database worker's write failed with disk_full, a small test write passes: DiskFull until then). The
same statement reads the server's connection slots, from which the shard's connection budget is
recorded (reconciler.shard.budget), and the primary's timeline: a new one (a failover or switchover)
has every Ready (or soft-deleted and disabled) Database of the shard verified once and the drops its status
remembers repeated where the failover lost them (reconciler.shard.failover, reconciler.shard.dropped);
remembered drops older than softDelete.rememberDrops are pruned from the status. Its timeouts follow
the link (`ShardLinks`: from the measured round trip, bounded), and a Ready shard gets a second try with
the longer timeouts before it is declared Unreachable, so a slow or flaky link that still answers stays
Ready. A shard that does not answer is marked so in `ShardLinks`: the Database workers' sessions to it are
cut at once and no new ones are opened until a ping passes, so its work waits instead of hanging.

A deleted Shard is held by its finalizer while Databases are placed on it (reconciler.shard.deletion).

The Ready condition's reason says what is wrong (Ok, AdminAuthFailed, AdminSecretInvalid,
AdminTlsRequired, AdminEndpointMismatch, Unreachable, ReadOnly, InRecovery, DiskFull,
ClusterNotRunning, ClusterScaling, EngineUnavailable, ProvisionerInherits/ProvisionerInvalid);
messages carry a sanitized error class only. A shard that is not Ready gets no placements
(reconciler.placement_index reads this condition).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.config import SoftDeleteConfig
from domain.connection_budget import ServerSlots
from domain.constants import (
    KELDON_PHASE_RUNNING,
    KELDON_PHASE_SCALING,
    Engine,
    Phase,
    ShardConditionType,
    ShardReason,
)
from domain.objects import DatabaseGlance, ShardState, cluster_phase, database_placement, verified_after_failover
from domain.resources import BY_SHARD, SHARDS
from domain.settings import SETTINGS
from domain.specs import ShardSpec, parse_shard
from domain.validation import format_validation_error
from informers import Informer, Rest, object_key
from reconciler.runtime import Result, StatusEchoes, Wakeups
from reconciler.shard.admin import AdminPolicy, AdminRefused, AdminSessions, admin_endpoint
from reconciler.shard.budget import ShardBudgets
from reconciler.shard.client_logins import report_client_logins
from reconciler.shard.deletion import ShardDeletion
from reconciler.shard.dropped import remembered, repeat_drops
from reconciler.shard.failover import TimelineRepairs
from reconciler.shard.links import ShardLinks
from reconciler.shard.suspects import ShardSuspects
from reconciler.sql import errors as sqlerrors
from reconciler.sql.errors import SqlFailure, is_auth_failure
from reconciler.sql.provisioner import WEAK_CREATEROLE_MESSAGE, dialect_problem
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.shard_probe import probe_shard, probe_write

log = logging.getLogger(__name__)

# The check intervals and timeouts: SETTINGS.shard_checks says why each is what it is.
PING_INTERVAL = SETTINGS.shard_checks.ready_interval
NOT_READY_RECHECK = SETTINGS.shard_checks.not_ready_interval  # seconds between pings of a shard not Ready
# A suspected shard (a failed or hanging statement) is pinged at once, but not more often than this.
MIN_FORCED_GAP = 1.0
# A burst of Database changes would ping the shard once per change; within this gap (and for an
# unchanged Shard generation) the last result stands and only databaseCount is refreshed.
MIN_PING_GAP = SETTINGS.shard_checks.min_gap
# While the Ready Databases of a shard are verified after its primary's timeline changed: how often to
# look whether they are done (the SQL ping itself stays paced by MIN_PING_GAP).
VERIFYING_RECHECK = 2.0
# How long status.droppedTenants keeps a drop, unless the install says otherwise (softDelete.rememberDrops).
DEFAULT_REMEMBER_DROPS = SoftDeleteConfig().remember_drops
# Conditions that single out one reason of a failed check: (type, that reason, message while it is False).
FAILURE_CONDITIONS: tuple[tuple[ShardConditionType, ShardReason, str], ...] = (
    (ShardConditionType.ADMIN_AUTH_FAILED, ShardReason.ADMIN_AUTH_FAILED, "admin credentials accepted or not checked"),
    (ShardConditionType.UNREACHABLE, ShardReason.UNREACHABLE, "no connection problem seen"),
)


@dataclass(frozen=True)
class Health:
    """The outcome of one check of a shard."""

    reason: ShardReason
    message: str
    server_version: str | None = None
    weak_createrole: bool = False
    slots: ServerSlots | None = None  # the server's connection slots, as this check read them
    timeline: int | None = None  # the primary's timeline, as this check read it (reconciler.shard.failover)

    @property
    def ready(self) -> bool:
        return self.reason == ShardReason.OK

    @property
    def answering(self) -> bool:
        """False when no new session got through: the shard's sessions are cut, none opened."""
        return self.reason != ShardReason.UNREACHABLE


def observe(
    shard: ShardState, health: Health, database_count: int, *, cloudberry: bool, now: datetime | None = None
) -> ShardState:
    """The Shard's status after one check: its conditions, databaseCount and (when read) serverVersion.
    Conditions that change in one check change at the same moment (`now`)."""
    now = now or datetime.now(UTC).replace(microsecond=0)
    shard = shard.with_condition(ShardConditionType.READY, health.ready, health.reason, health.message, now=now)
    for type_, reason, message_when_fine in FAILURE_CONDITIONS:
        failed = health.reason == reason
        message = health.message if failed else message_when_fine
        shard = shard.with_condition(type_, failed, reason if failed else ShardReason.OK, message, now=now)
    if health.server_version is not None:
        weak = health.weak_createrole
        shard = shard.with_condition(
            ShardConditionType.WEAK_ROLE_ISOLATION,
            weak,
            ShardReason.SERVER_BEFORE_16 if weak else ShardReason.OK,
            WEAK_CREATEROLE_MESSAGE if weak else "CREATEROLE manages only its own roles",
            now=now,
        )
    if cloudberry:
        # True while its cluster is Scaling; its lastTransitionTime is when scaling began
        # (dbprovider_shard_scaling_seconds counts from it).
        scaling = health.reason == ShardReason.CLUSTER_SCALING
        shard = shard.with_condition(
            ShardConditionType.SCALING,
            scaling,
            ShardReason.CLUSTER_SCALING if scaling else ShardReason.OK,
            "the DatabaseCluster is Scaling" if scaling else "the DatabaseCluster is not Scaling",
            now=now,
        )
    observed = {
        "observed_generation": shard.metadata.generation,
        "database_count": database_count,
        "server_version": health.server_version,  # None (not checked this time): the last one stays
    }
    return shard.with_status(**{field: value for field, value in observed.items() if value is not None})


class ShardController:
    def __init__(
        self,
        rest: Rest,
        shards: Informer,
        databases: Informer,
        clusters: Informer | None = None,
        sessions: AdminSessions | None = None,
        admin_host_override: str | None = None,
        ping_interval: float = PING_INTERVAL,
        policy: AdminPolicy | None = None,
        budgets: ShardBudgets | None = None,
        deletion: ShardDeletion | None = None,
        suspects: ShardSuspects | None = None,
        wakeups: Wakeups | None = None,
        repairs: TimelineRepairs | None = None,
        remember_drops: timedelta = DEFAULT_REMEMBER_DROPS,
    ) -> None:
        self.rest = rest
        self.remember_drops = remember_drops  # how long status.droppedTenants keeps a drop (shard.dropped)
        self.budgets = budgets  # the connection budget in the status (reconciler.shard.budget)
        self.deletion = deletion  # the finalizer that holds a deleted Shard while it has databases
        self.policy = policy or AdminPolicy()  # shardSecrets: without it no admin Secret is used
        self.shards = shards
        self.databases = databases
        self.clusters = clusters
        self.sessions = sessions or AdminSessions()
        self.links: ShardLinks = self.sessions.links
        self.admin_host_override = admin_host_override
        self.ping_interval = ping_interval
        self.min_ping_gap = min(MIN_PING_GAP, ping_interval)
        # shard -> (when, generation, result); workers touch distinct shards (one key, one worker)
        self._last: dict[str, tuple[float, int | None, Health]] = {}
        # Shards whose SQL failed or hangs in a Database worker: pinged at once (reconciler.shard.suspects)
        self.suspects = suspects or ShardSuspects()
        # The verification of a shard's Ready Databases after its primary's timeline changed.
        self.repairs = repairs or TimelineRepairs()
        self._spread: set[str] = set()  # Ready shards whose checks have been given their place in the interval
        # Our own status writes: their watch events wake no pass (setup.py; a pass on the echo wrote the
        # count again at once, past the burst's COUNT_BURST_GAP).
        self.echoes = StatusEchoes(wakeups.enqueue if wakeups is not None else None)

    # -- checks ----------------------------------------------------------------------------------

    def _cluster_health(self, spec: ShardSpec) -> Health | None:
        """For cloudberry: what the Keldon DatabaseCluster says (None: it is Running, ping the shard).

        Scaling is planned work, not an outage: placement pauses (catalog changes are not safe while
        segments are added) with its own reason, and the critical alert leaves it alone. If the
        DatabaseCluster kind cannot be listed (its CRD missing or not served), only cloudberry shards
        are affected: they say so, and the rest of the provider runs.
        """
        if spec.engine != Engine.CLOUDBERRY:
            return None
        ref = spec.cluster
        if self.clusters is None:
            return Health(
                ShardReason.CLUSTER_NOT_RUNNING,
                "cloudberry shards are not enabled in this install (engines.cloudberry.enabled)",
            )
        if not self.clusters.has_synced():
            return Health(
                ShardReason.ENGINE_UNAVAILABLE,
                f"the cloudberry engine is unavailable: DatabaseClusters cannot be listed "
                f"({self.clusters.sync_problem()}); postgres shards are not affected",
            )
        cluster = self.clusters.get(f"{ref.namespace}/{ref.name}")
        if cluster is None:
            return Health(ShardReason.CLUSTER_NOT_RUNNING, f"DatabaseCluster {ref.namespace}/{ref.name} not found")
        phase = cluster_phase(cluster) or "Unknown"
        if phase == KELDON_PHASE_RUNNING:
            return None
        if phase == KELDON_PHASE_SCALING:
            return Health(
                ShardReason.CLUSTER_SCALING,
                f"DatabaseCluster {ref.namespace}/{ref.name} is Scaling: no new databases are placed and SQL "
                "for its databases waits until it is Running again; its databases keep working",
            )
        if phase == "Failed":
            return Health(
                ShardReason.CLUSTER_NOT_RUNNING, f"DatabaseCluster {ref.namespace}/{ref.name} has failed (phase Failed)"
            )
        where = f"{ref.namespace}/{ref.name}"
        return Health(ShardReason.CLUSTER_NOT_RUNNING, f"DatabaseCluster {where} is not Running (phase {phase})")

    def check(self, name: str, spec: ShardSpec) -> Health:
        cluster = self._cluster_health(spec)
        if cluster is not None:
            return cluster
        try:
            endpoint = admin_endpoint(self.rest, name, spec, self.policy, self.admin_host_override)
        except AdminRefused as exc:
            return Health(exc.reason, str(exc))
        except ApiException as exc:
            return Health(ShardReason.ADMIN_SECRET_INVALID, f"admin Secret not readable (HTTP {exc.status})")
        last = self._last.get(name)
        health, timed_out = self._ping(name, endpoint)
        if timed_out and last is not None and last[2].ready:
            # A Ready shard gets a second try with the longer timeouts ShardLinks has learnt: a slow
            # link that still answers stays Ready; a dead one is Unreachable after both.
            health, _ = self._ping(name, endpoint)
        return health

    def _ping(self, name: str, endpoint: AdminEndpoint) -> tuple[Health, bool]:
        """One ping on a fresh session; (its health, whether it ran out of time)."""
        timeouts = self.links.timeouts(name)
        try:
            with self.sessions.one_off(endpoint, timeouts.connect) as session:
                probe = probe_shard(session, timeout=timeouts.total)
                full = self._disk_full(name, session, timeouts.total) if probe.writability.problem() is None else None
        except SqlFailure as failure:
            if is_auth_failure(failure):
                detail = f" ({failure.detail})" if failure.detail else ""  # e.g. a relay terminating TLS
                message = f"admin login failed: {failure.error_class}{detail}"
                return Health(ShardReason.ADMIN_AUTH_FAILED, message), False
            timed_out = failure.error_class == sqlerrors.TIMEOUT
            if timed_out:
                self.links.timed_out(name)
            message = f"{failure} after {timeouts.total:.0f}s" if timed_out else str(failure)
            return Health(ShardReason.UNREACHABLE, message), timed_out
        self.links.measured(name, probe.round_trip)
        info, slots = probe.info, probe.slots
        version = f"{info.major}.{info.server_version_num % 10000}"
        problem = dialect_problem(info)
        if problem is not None:
            reason = (
                ShardReason.PROVISIONER_INHERITS
                if info.inherit and info.weak_createrole
                else (ShardReason.PROVISIONER_INVALID)
            )
            return Health(reason, problem, version, info.weak_createrole, slots), False
        problem = probe.writability.problem()
        if problem is not None:
            reason = ShardReason.IN_RECOVERY if probe.writability.in_recovery else ShardReason.READ_ONLY
            return Health(reason, problem, version, info.weak_createrole, slots), False
        if full is not None:
            return Health(ShardReason.DISK_FULL, full, version, info.weak_createrole, slots), False
        healthy = "admin connection healthy"
        return Health(ShardReason.OK, healthy, version, info.weak_createrole, slots, probe.timeline), False

    def _disk_full(self, name: str, session: AdminSession, timeout: float) -> str | None:
        """For a shard whose SQL failed with disk_full: why a small write still fails, or None (it passed)."""
        if not self.suspects.disk_full(name):
            return None
        try:
            probe_write(session, timeout=timeout)
        except SqlFailure as failure:
            if failure.error_class != sqlerrors.DISK_FULL:
                raise
            return f"{failure}: the shard's disk is full (a SQL write failed with disk_full); free space on it"
        self.suspects.disk_passed(name)
        return None

    def _health(self, name: str, spec: ShardSpec, generation: int | None) -> Health:
        """check(), but for an unchanged Shard the SQL ping of a Ready one at most every
        min_ping_gap, of one that is not Ready at most every NOT_READY_RECHECK; a suspected one
        (see `suspects`) at once, at most every MIN_FORCED_GAP.

        The DatabaseCluster phase comes from the cache and is always current.
        """
        cluster = self._cluster_health(spec)
        if cluster is not None:
            self._last.pop(name, None)
            self.suspects.take(name)  # answered by the cluster's phase; a check follows once it runs
            return cluster
        last = self._last.get(name)
        gap = self.min_ping_gap if last is not None and last[2].ready else NOT_READY_RECHECK
        if self.suspects.pending(name):
            gap = MIN_FORCED_GAP
        if last is not None and last[1] == generation and time.monotonic() - last[0] < gap:
            return last[2]  # a suspicion stays pending: the pass is repeated after MIN_FORCED_GAP (reconcile)
        self.suspects.take(name)  # this check answers it; a failure from now on is a new suspicion
        health = self.check(name, spec)
        self._last[name] = (time.monotonic(), generation, health)
        if health.ready:
            self.suspects.passed(name)  # placement may use it again, if a failed statement had suspended it
        self._follow_answering(name, health)
        return health

    def _follow_answering(self, name: str, health: Health) -> None:
        """Tell the Database workers' sessions whether the shard answers; cut them when it stopped."""
        if self.links.set_not_answering(name, None if health.answering else health.message):
            cut = self.sessions.abort(name)
            log.warning("shard not answering: its sessions cut", extra={"shard": name, "sessions": cut})

    # -- reconcile -------------------------------------------------------------------------------

    def reconcile(self, name: str) -> Result | None:
        cached = self.shards.get(name)
        if cached is None:
            self.sessions.drop(name)
            self._last.pop(name, None)
            self.suspects.forget(name)
            self._spread.discard(name)
            self.links.forget(name)
            self.echoes.forget(name)
            self.repairs.forget(name)
            if self.deletion is not None:
                self.deletion.forget(name)
            return None
        if self.deletion is not None:
            converged = self.deletion.converge(name, cached)
            if converged is None:
                return None  # on its way out: the next pass finds it gone
            cached = converged
        # Metadata and status typed once; a status that does not validate is written anew (its keys a
        # newer release wrote are kept), and the spec apart: an invalid one is reported, not raised.
        shard, _ = ShardState.parse_lenient_status(cached)
        spec: ShardSpec | None
        try:
            spec = parse_shard(cached)
        except ValidationError as exc:
            spec = None
            # The offending fields and why (a Shard holds no secret: names, endpoints, public CAs).
            health = Health(ShardReason.UNREACHABLE, f"the Shard's spec is invalid: {format_validation_error(exc)}")
        else:
            health = self._health(name, spec, shard.metadata.generation)
        cloudberry = spec is not None and spec.engine == Engine.CLOUDBERRY
        shard = observe(shard, health, self.databases.count_by_index(BY_SHARD, name), cloudberry=cloudberry)
        shard = report_client_logins(shard, self.databases.by_index(BY_SHARD, name))
        shard, verifying = self._follow_timeline(name, shard, health, spec)
        if not verifying:
            kept = remembered(shard.status.dropped_tenants, datetime.now(UTC), self.remember_drops)
            if kept != shard.status.dropped_tenants:
                shard = shard.with_status(dropped_tenants=kept)
        if self.deletion is not None:
            shard = self.deletion.report(shard)
        if self.budgets is not None:
            takes = (
                health.ready and spec is not None and spec.accepting and not spec.drain and not shard.metadata.deleting
            )
            max_databases = spec.max_databases if spec is not None else None
            view = self.budgets.of(name, health.slots, shard.status, max_databases=max_databases, takes_databases=takes)
            shard = self.budgets.record(shard, view)
        if self.echoes.write(self.rest, SHARDS, shard) is not None and not health.ready:
            log.warning("shard not ready", extra={"shard": name, "reason": str(health.reason)})
        if spec is not None and self.suspects.pending(name):
            # Suspected within MIN_FORCED_GAP of the last check (or during it): it owes a check, and
            # placement leaves the shard until one passes.
            return Result(requeue_after=MIN_FORCED_GAP)
        if not health.ready:
            return Result(requeue_after=min(NOT_READY_RECHECK, self.ping_interval))
        if verifying:
            return Result(requeue_after=min(VERIFYING_RECHECK, self.ping_interval))
        return Result(requeue_after=self.ready_interval(name))

    def _follow_timeline(
        self, name: str, shard: ShardState, health: Health, spec: ShardSpec | None
    ) -> tuple[ShardState, bool]:
        """Record the primary's timeline, once the shard's remembered drops were repeated where lost and
        each of its Ready or disabled Databases was verified for it (reconciler.shard.failover); (the
        status, whether a verification is under way)."""
        timeline, recorded = health.timeline, shard.status.timeline
        if timeline is None or timeline == recorded or spec is None:
            return shard, False
        if recorded is not None:
            self.repairs.start(name, timeline)
            databases = self.databases.by_index(BY_SHARD, name)
            if not self._repeat_drops(name, shard, spec, timeline, databases):
                return shard, True
            verified = [object_key(db) for db in databases if verified_after_failover(db)]
            if not self.repairs.complete(name, timeline, verified):
                return shard, True
            log.info(
                "databases verified after a timeline change",
                extra={"shard": name, "timeline": timeline, "databases": len(verified)},
            )
        return shard.with_status(timeline=timeline), False

    def _repeat_drops(
        self, name: str, shard: ShardState, spec: ShardSpec, timeline: int, databases: list[dict[str, Any]]
    ) -> bool:
        """Drop again each remembered tenant the new primary has (reconciler.shard.dropped), except one a
        Database placed here still names; True once none is left to do."""
        in_use = {
            tenant
            for db in databases
            if (tenant := database_placement(db)[1]) and DatabaseGlance.of(db).phase != Phase.DELETED
        }
        recorded = [entry.name for entry in shard.status.dropped_tenants if entry.name not in in_use]
        pending = self.repairs.drops_pending(name, timeline, recorded)
        if not pending:
            return True
        timeouts = self.links.timeouts(name)
        try:
            endpoint = admin_endpoint(self.rest, name, spec, self.policy, self.admin_host_override)
            with self.sessions.one_off(endpoint, timeouts.connect) as session:
                repeat_drops(session, name, pending, lambda tenant: self.repairs.drop_repeated(name, timeline, tenant))
        except (SqlFailure, AdminRefused, ApiException) as exc:
            problem = exc.error_class if isinstance(exc, SqlFailure) else type(exc).__name__
            log.warning("repeating drops after a timeline change failed", extra={"shard": name, "error": problem})
            return False
        return True

    def ready_interval(self, name: str) -> float:
        """When to check a Ready shard again: ping_interval, stretched in a large fleet so that all shards'
        checks together stay under SETTINGS.shard_checks.ready_checks_per_second. A fleet that started
        together would be checked in one burst every interval: a shard's first interval is drawn from the
        whole interval, so the checks spread evenly, and later ones keep their place (a little jitter). Each
        ends on the grid of `on_grid`: the checks due in the same two seconds start together."""
        interval = SETTINGS.shard_checks.ready_interval_for(len(self.shards), self.ping_interval)
        if name not in self._spread:
            self._spread.add(name)
            return on_grid(interval * random.uniform(0.1, 1.0), interval)
        return on_grid(interval * random.uniform(0.95, 1.0), interval)


def on_grid(delay: float, interval: float, now: float | None = None) -> float:
    """`delay`, shortened to end on the process' grid of SETTINGS.shard_checks.ready_check_grid seconds
    (monotonic clock; at most a quarter of `interval`), so the Ready checks due in the same stretch start
    together (the settings say why); never shortened to less than half of itself."""
    grid = min(SETTINGS.shard_checks.ready_check_grid, interval / 4)
    if grid <= 0:
        return delay
    start = time.monotonic() if now is None else now
    due = math.floor((start + delay) / grid) * grid
    if due - start < delay / 2:
        due += grid
    return due - start
