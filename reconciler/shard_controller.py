"""The Shard controller: is the shard's admin connection usable, and how many databases it holds.

Pings every Ready shard every 15 s (PING_INTERVAL) and a shard that is not Ready every 5 s
(NOT_READY_RECHECK), so a failure is seen and a recovery taken up well within the guide's
minute; also whenever the Shard or one of its Databases changes (a Ready shard at most every 10 s:
a burst of placements must not ping once per database). Each ping opens a NEW admin connection
with a short timeout and closes it: a reused session would keep answering while the postmaster
accepts no new connections (stopped, out of slots), which no consumer could then use. Shards are
checked concurrently (the controller's workers), so dead shards do not delay the others. The Ready
condition's reason says what is wrong (Ok, AdminAuthFailed, AdminSecretInvalid, AdminTlsRequired,
AdminEndpointMismatch, Unreachable, ClusterNotRunning, ProvisionerInherits/ProvisionerInvalid);
messages carry a sanitized error class only. A shard that is not Ready gets no placements
(reconciler.placement reads this condition).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.connection_budget import ServerSlots
from domain.constants import KELDON_PHASE_RUNNING, Engine, ShardConditionType, ShardReason
from domain.settings import SETTINGS
from domain.specs import ShardSpec, parse_shard
from domain.status import ShardStatus
from domain.validation import dump_set_fields
from informers import Informer, Rest
from reconciler.admin import AdminPolicy, AdminRefused, AdminSessions, admin_endpoint
from reconciler.resources import BY_SHARD, SHARDS
from reconciler.runtime import Result, set_condition, update_status
from reconciler.shard_budget import ShardBudgets
from reconciler.sql.errors import SqlFailure, is_auth_failure
from reconciler.sql.provisioner import WEAK_CREATEROLE_MESSAGE, dialect_problem, inspect_provisioner, read_server_slots

log = logging.getLogger(__name__)

# The check intervals and timeouts: SETTINGS.shard_checks says why each is what it is.
PING_INTERVAL = SETTINGS.shard_checks.ready_interval
NOT_READY_RECHECK = SETTINGS.shard_checks.not_ready_interval  # seconds between pings of a shard not Ready
PING_TIMEOUT = SETTINGS.shard_checks.timeout  # one whole ping: connect, authenticate, read the catalog
PING_CONNECT_TIMEOUT = SETTINGS.shard_checks.connect_timeout
# A burst of Database changes would ping the shard once per change; within this gap (and for an
# unchanged Shard generation) the last result stands and only databaseCount is refreshed.
MIN_PING_GAP = SETTINGS.shard_checks.min_gap
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

    @property
    def ready(self) -> bool:
        return self.reason == ShardReason.OK


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
    ) -> None:
        self.rest = rest
        self.budgets = budgets  # the connection budget in the status (reconciler.shard_budget)
        self.policy = policy or AdminPolicy()  # shardSecrets: without it no admin Secret is used
        self.shards = shards
        self.databases = databases
        self.clusters = clusters
        self.sessions = sessions or AdminSessions()
        self.admin_host_override = admin_host_override
        self.ping_interval = ping_interval
        self.min_ping_gap = min(MIN_PING_GAP, ping_interval)
        # shard -> (when, generation, result); workers touch distinct shards (one key, one worker)
        self._last: dict[str, tuple[float, int | None, Health]] = {}

    # -- checks ----------------------------------------------------------------------------------

    def _cluster_problem(self, spec: ShardSpec) -> str | None:
        """For cloudberry: the Keldon DatabaseCluster must exist and be Running."""
        if spec.engine != Engine.CLOUDBERRY:
            return None
        ref = spec.cluster
        if self.clusters is None:
            return "cloudberry shards are not enabled in this install (engines.cloudberry.enabled)"
        cluster = self.clusters.get(f"{ref.namespace}/{ref.name}")
        if cluster is None:
            return f"DatabaseCluster {ref.namespace}/{ref.name} not found"
        phase = (cluster.get("status") or {}).get("phase") or "Unknown"
        if phase == "Failed":
            return f"DatabaseCluster {ref.namespace}/{ref.name} has failed (phase Failed)"
        if phase != KELDON_PHASE_RUNNING:
            return f"DatabaseCluster {ref.namespace}/{ref.name} is not Running (phase {phase})"
        return None

    def check(self, name: str, spec: ShardSpec) -> Health:
        problem = self._cluster_problem(spec)
        if problem is not None:
            return Health(ShardReason.CLUSTER_NOT_RUNNING, problem)
        try:
            endpoint = admin_endpoint(self.rest, name, spec, self.policy, self.admin_host_override)
        except AdminRefused as exc:
            return Health(exc.reason, str(exc))
        except ApiException as exc:
            return Health(ShardReason.ADMIN_SECRET_INVALID, f"admin Secret not readable (HTTP {exc.status})")
        try:
            with self.sessions.one_off(endpoint, PING_CONNECT_TIMEOUT) as session:
                info = inspect_provisioner(session, timeout=PING_TIMEOUT)
                slots = read_server_slots(session, timeout=PING_TIMEOUT)
        except SqlFailure as failure:
            if is_auth_failure(failure):
                detail = f" ({failure.detail})" if failure.detail else ""  # e.g. a relay terminating TLS
                return Health(ShardReason.ADMIN_AUTH_FAILED, f"admin login failed: {failure.error_class}{detail}")
            return Health(ShardReason.UNREACHABLE, str(failure))
        version = f"{info.major}.{info.server_version_num % 10000}"
        problem = dialect_problem(info)
        if problem is not None:
            reason = (
                ShardReason.PROVISIONER_INHERITS
                if info.inherit and info.weak_createrole
                else (ShardReason.PROVISIONER_INVALID)
            )
            return Health(reason, problem, version, info.weak_createrole)
        return Health(ShardReason.OK, "admin connection healthy", version, info.weak_createrole, slots)

    def _health(self, name: str, spec: ShardSpec, generation: int | None) -> Health:
        """check(), but for an unchanged Shard the SQL ping of a Ready one at most every
        min_ping_gap, of one that is not Ready at most every NOT_READY_RECHECK.

        The DatabaseCluster phase comes from the cache and is always current.
        """
        problem = self._cluster_problem(spec)
        if problem is not None:
            self._last.pop(name, None)
            return Health(ShardReason.CLUSTER_NOT_RUNNING, problem)
        last = self._last.get(name)
        gap = self.min_ping_gap if last is not None and last[2].ready else NOT_READY_RECHECK
        if last is not None and last[1] == generation and time.monotonic() - last[0] < gap:
            return last[2]
        health = self.check(name, spec)
        self._last[name] = (time.monotonic(), generation, health)
        return health

    # -- reconcile -------------------------------------------------------------------------------

    def reconcile(self, name: str) -> Result | None:
        shard = self.shards.get(name)
        if shard is None:
            self.sessions.drop(name)
            self._last.pop(name, None)
            return None
        generation = shard["metadata"].get("generation")
        try:
            spec = parse_shard(shard)
        except ValidationError:
            health = Health(ShardReason.UNREACHABLE, "the Shard's spec is invalid")
        else:
            health = self._health(name, spec, generation)
        status = copy.deepcopy(shard.get("status") or {})
        conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
        set_condition(conditions, ShardConditionType.READY, health.ready, health.reason, health.message, generation)
        for type_, reason, message_when_fine in FAILURE_CONDITIONS:
            failed = health.reason == reason
            set_condition(
                conditions,
                type_,
                failed,
                reason if failed else ShardReason.OK,
                health.message if failed else message_when_fine,
                generation,
            )
        if health.server_version is not None:
            set_condition(
                conditions,
                ShardConditionType.WEAK_ROLE_ISOLATION,
                health.weak_createrole,
                ShardReason.SERVER_BEFORE_16 if health.weak_createrole else ShardReason.OK,
                WEAK_CREATEROLE_MESSAGE if health.weak_createrole else "CREATEROLE manages only its own roles",
                generation,
            )
        observed = ShardStatus(
            observed_generation=generation,
            database_count=self.databases.count_by_index(BY_SHARD, name),
            server_version=health.server_version,  # None (not checked this time): the last one stays
        )
        status.update(dump_set_fields(observed))
        if self.budgets is not None:
            self.budgets.record(name, self.budgets.of(name, health.slots, status), status, conditions, generation)
        if update_status(self.rest, SHARDS, shard, status) is not None and not health.ready:
            log.warning("shard not ready", extra={"shard": name, "reason": str(health.reason)})
        return Result(requeue_after=self.ping_interval if health.ready else min(NOT_READY_RECHECK, self.ping_interval))
