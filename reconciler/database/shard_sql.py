"""Running one SQL operation on the placed shard: the admin session, and what a failure means.

Every SQL step of the controller goes through `ShardSql.run`: it gets the shard's admin session,
runs the operation, and turns a `SqlFailure` into a recorded failure with its sanitized class.

- The shard is not Ready, or the Shard controller found it not answering (`shard_not_answering`:
  its sessions were cut): the work waits (`Waiting`, reason `ShardNotReady`, the phase kept). No
  SQL is tried, no retry is spent and no error is counted; the pass runs again when the Shard
  turns Ready (its event enqueues its databases), at the latest after `SHARD_WAIT_RETRY`.
- An unusable admin Secret: the step's reason, retried with backoff.
- retryable (`SqlFailure.retryable`, classified once in reconciler.sql.errors.RETRYABLE):
  `ReconcileError`, retried with backoff (timeouts, a lost connection, a lock held, an unreachable
  shard, the admin connection refused, an unknown cause). When the class says more about the shard
  than about this database (`SHARD_TROUBLE`), the Shard controller checks the shard at once and the
  retries stay at most `SHARD_TROUBLE_RETRY_CAP` apart, so a shard that recovers is used within a
  minute;
- terminal (name_taken, insufficient_privilege, invalid_provisioner, not_found, dependent_objects):
  `TerminalError`, counted with `retryable="false"` and not retried with backoff. A person has to
  fix something first; the pass runs again on the next change of the Database, of its Shard
  (readiness or spec) or of its credentials Secret, and at the latest after `TERMINAL_RETRY`.

The admin connection's own refusals (auth_failed, insecure_auth_refused, tls_failed) are retryable
in that table: they are the Shard's problem, reported by the Shard controller (AdminAuthFailed /
Unreachable, checked at once via `on_shard_trouble`), and the first retry reads the admin Secret again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from domain.conditions import READY, condition_is_true, condition_reason
from domain.constants import DatabaseReason, Phase
from domain.credentials import Endpoint
from domain.objects import Obj, ShardState
from domain.settings import SETTINGS
from domain.specs import ShardSpec, parse_shard
from informers import object_key
from reconciler.database.report import Reporter, Waiting
from reconciler.database.state import Database
from reconciler.runtime import ReconcileError
from reconciler.shard.admin import AdminEndpointCache, AdminRefused, AdminSessions
from reconciler.sql import errors as sqlerrors
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession

# A fixed cause of a terminal failure is picked up within this time even without any event (a DBA
# drops a foreign database); like NoCapacity's retry, and what keeps DBProviderReconcileErrors firing.
TERMINAL_RETRY = SETTINGS.retry.terminal
# SQL failures that say more about the shard than about this database: the Shard controller looks
# now (not at its next ping), and a changed readiness enqueues the shard's databases again.
SHARD_TROUBLE = frozenset(
    {
        sqlerrors.UNREACHABLE,
        sqlerrors.CONNECTION_LOST,
        sqlerrors.TIMEOUT,
        sqlerrors.AUTH_FAILED,
        sqlerrors.INSECURE_AUTH_REFUSED,
        sqlerrors.TLS_FAILED,
        sqlerrors.READ_ONLY,
        sqlerrors.DISK_FULL,
        sqlerrors.TOO_MANY_CONNECTIONS,
    }
)
SHARD_TROUBLE_RETRY_CAP = SETTINGS.sql.shard_trouble_retry_cap
# A database waiting for its shard looks again this often without any event (the Shard turning Ready
# enqueues it at once); like an unplaced database waiting for a Ready shard.
SHARD_WAIT_RETRY = SETTINGS.retry.shards_unavailable

Operation = Callable[[AdminSession], object]


def is_terminal(failure: SqlFailure) -> bool:
    """True when retrying soon cannot help (reconciler.sql.errors.RETRYABLE says which)."""
    return not failure.retryable


def shard_spec(shard: dict[str, Any]) -> ShardSpec | None:
    """The Shard's typed spec, or None when it does not parse (the Shard controller reports that)."""
    try:
        return parse_shard(shard)
    except ValidationError:
        return None


class ShardSpecs:
    """Shard specs parsed once per resourceVersion: a pass over every Database of a shard (a start, a resync)
    would otherwise parse the same spec for each of them. The models are frozen, so sharing them is safe;
    dict reads and writes are atomic, so the workers need no lock (two may parse the same version once each)."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[str, ShardSpec | None, Endpoint | None]] = {}

    def of(self, shard: Obj) -> ShardSpec | None:
        """`shard_spec(shard)`, from the cache when this version of the Shard was parsed before."""
        return self._parsed(shard)[0]

    def endpoint(self, shard: Obj) -> Endpoint | None:
        """`client_endpoint` of its spec (None: the spec does not parse), one object per version: a start
        compares it for every Database of the shard."""
        return self._parsed(shard)[1]

    def _parsed(self, shard: Obj) -> tuple[ShardSpec | None, Endpoint | None]:
        meta = shard.get("metadata") or {}
        name, version = meta.get("name"), meta.get("resourceVersion")
        held = self._specs.get(name) if isinstance(name, str) else None
        if held is not None and held[0] == version:
            return held[1], held[2]
        spec = shard_spec(shard)
        endpoint = client_endpoint(spec) if spec is not None else None
        if isinstance(name, str) and isinstance(version, str):
            self._specs[name] = (version, spec, endpoint)
        return spec, endpoint


def shard_state(shard: Obj) -> ShardState:
    """The Shard's metadata and status, typed; a status that does not validate reads as empty (not Ready)."""
    return ShardState.parse_lenient_status(shard)[0]


def shard_ready(state: ShardState) -> bool:
    """Its Ready condition is True: SQL may run on it."""
    return condition_is_true(state.status.conditions, READY)


def client_endpoint(spec: ShardSpec) -> Endpoint:
    """What consumers are told to connect to (the Shard's client block, defaults from the model)."""
    return Endpoint.of_shard(spec)


@dataclass
class ShardSql:
    """Admin sessions and SQL runs for the parts; the one place a SqlFailure becomes a reconcile failure."""

    sessions: AdminSessions
    admin_endpoints: AdminEndpointCache
    report: Reporter
    # Called with a shard's name and the failure's class when its SQL failed as if the shard were in
    # trouble (the Shard controller's ShardSuspects: it checks the shard now).
    on_shard_trouble: Callable[[str, str], None] | None = None

    def session(self, database: Database, shard: dict[str, Any], phase: Phase, reason: str) -> AdminSession:
        """An admin session for the placed shard; `Waiting` while it is not Ready, or a recorded
        failure (retried with backoff) when its admin Secret is unusable."""
        state = shard_state(shard)
        name = state.name
        if not shard_ready(state):
            why = condition_reason(state.status.conditions, READY) or "not checked yet"
            raise self.wait_for_shard(database, name, phase, why)
        spec = shard_spec(shard)
        if spec is None:
            raise self.report.failure(database, phase, reason, f"shard {name} has an invalid spec; retrying")
        try:
            endpoint = self.admin_endpoints.get(name, spec)
        except (AdminRefused, ApiException) as exc:
            detail = str(exc) if isinstance(exc, AdminRefused) else f"HTTP {exc.status}"
            raise self.report.failure(
                database, phase, reason, f"no usable admin connection to shard {name}: {detail}"
            ) from None
        return self.sessions.get(name, endpoint)

    def run(
        self,
        database: Database,
        shard: dict[str, Any],
        phase: Phase,
        reason: str,
        operation: Operation,
        *,
        session_reason: str | None = None,
    ) -> None:
        """Run `operation` on the shard's admin session; a failure is recorded with `reason` and raised.

        `session_reason` is the reason when no session can be had (default: `reason`).
        """
        session = self.session(database, shard, phase, session_reason or reason)
        try:
            operation(session)
        except SqlFailure as failure:
            raise self.failed(database, object_key(shard), phase, reason, failure) from None

    def wait_for_shard(self, database: Database, shard: str, phase: Phase, why: str) -> Waiting:
        """The work on this database waits for its shard (see the module docstring)."""
        return self.report.waiting(
            database,
            phase,
            DatabaseReason.SHARD_NOT_READY,
            f"shard {shard} is not Ready ({why}); waiting, the work goes on when it is Ready",
            SHARD_WAIT_RETRY,
        )

    def failed(
        self, database: Database, shard: str, phase: Phase, reason: str, failure: SqlFailure
    ) -> ReconcileError | Waiting:
        """Forget the shard's session and admin Secret (the retry reads them again); what to raise."""
        self.sessions.drop(shard)
        self.admin_endpoints.forget(shard)
        if failure.error_class == sqlerrors.SHARD_NOT_ANSWERING:
            return self.wait_for_shard(database, shard, phase, "Unreachable: it stopped answering")
        trouble = failure.error_class in SHARD_TROUBLE
        if trouble and self.on_shard_trouble is not None:
            self.on_shard_trouble(shard, failure.error_class)  # the Shard controller looks now
        terminal = is_terminal(failure)
        return self.report.failure(
            database,
            phase,
            reason,
            str(failure),
            terminal=terminal,
            requeue_after=TERMINAL_RETRY if terminal else None,
            retry_cap=SHARD_TROUBLE_RETRY_CAP if trouble else None,
        )
