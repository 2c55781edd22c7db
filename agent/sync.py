"""One pass of the agent over every claim of its cluster, on one conditional list of the provider.

A pass asks the provider for the consumer's databases with the ETag of the last answer (304 while
nothing changed: one cheap request, whatever the number of claims), then, from that list and the
caches of the claims and of the agent's Secrets, does per claim only what changed:

- a claim whose database the provider does not have: PUT (create); refusals (unknown size class,
  quota, a database being deleted) become the claim's Ready condition, retried now and then (those that
  depend on the consumer's other databases also as soon as the list changed);
- a claim that never had its Secret whose database is being deleted (a claim re-created after its
  predecessor was deleted): POST undelete, where the provider allows it; else it waits for the drop;
- a Ready database whose credentialsVersion differs from the one in the claim's Secret: GET the
  credentials and write the Secret (only on a difference; never a Secret that is not the claim's);
- a new value of the rotate annotation, or a rotation interval that has passed: POST rotate;
- a deleted claim: Delete starts the provider's soft delete (the claim shows dropAfter) and the
  finalizer goes once the provider accepted it, with the Secret; Orphan releases the Secret and leaves the database;
  the detach annotation lets a claim go without the provider.

The provider away (no answer, 5xx, 429) changes nothing but ProviderReachable: the Secrets keep their
last good values, deletes keep their finalizer. Two claims naming one databaseId: the older one has it,
the other is told so and never touches it. New Secret values roll the Deployments the claim names
(agent.rollout). The status is written only when it changes, and lastSyncTime with it: at rest a pass
writes nothing to any claim; when the agent last heard from the provider is `last_sync` (the
metrics and the agent's Lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from agent.binding import (
    binding_data,
    binding_secret,
    database_id,
    differs,
    is_claims_secret,
    merged,
    secret_name,
    secret_version,
    without_owner,
)
from agent.events import ClaimEvents
from agent.metrics import AgentMetrics
from agent.provider import Provider, ProviderError, ProviderUnreachable, View
from agent.rollout import roll
from domain.conditions import without_condition
from domain.constants import (
    ANNOTATION_CLAIM_DETACH,
    ANNOTATION_CLAIM_ROTATE,
    FINALIZER_CLAIM,
    ClaimPhase,
    DeletionPolicy,
)
from domain.naming import InvalidName
from domain.objects import ClaimObject, Obj
from domain.resources import CLAIMS
from domain.specs import ClaimRotation
from domain.status import ClaimBinding
from domain.timefmt import format_time, parse_time
from informers import SECRETS, Informer, Rest

log = logging.getLogger(__name__)

READY, REACHABLE, CURRENT, DELETING = "Ready", "ProviderReachable", "CredentialsCurrent", "Deleting"
ROLLED = "DeploymentsRolled"  # only on claims with spec.rolloutDeployments
# The API's error codes of a refused create, as the claim's Ready reason.
REFUSALS = {
    "unknown_size_class": "UnknownSizeClass",
    "quota_exceeded": "QuotaExceeded",
    "database_deleting": "DatabaseDeleting",
    "invalid_external_id": "InvalidDatabaseId",
    "invalid_body": "InvalidSpec",
}
# The API's error codes of a refused undelete, as the claim's Ready message says them.
UNDELETE_REFUSALS = {
    "undelete_not_allowed": "the provider does not allow undoing a delete",
    "database_gone": "it is being dropped",
    "quota_exceeded": "undoing the delete would exceed the consumer's quota",
}
# Refusals that the consumer's other databases decide: asked again as soon as the provider's list changed.
RETRY_ON_CHANGE = frozenset({"quota_exceeded", "database_deleting", "database_gone"})
PHASES = {
    "Provisioning": ClaimPhase.PROVISIONING,
    "Ready": ClaimPhase.READY,
    "Deleting": ClaimPhase.DELETING,
    "Deleted": ClaimPhase.DELETING,
    "Failed": ClaimPhase.FAILED,
}
REFUSED_RETRY = timedelta(minutes=5)

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class PassResult:
    """How a pass went: `reachable` False with the provider's Retry-After; `again_soon` when a claim waits
    for something that comes within seconds (a password being set, a write conflict)."""

    reachable: bool = True
    retry_after: float | None = None
    again_soon: bool = False


@dataclass
class _Refused:
    generation: int | None
    at: datetime
    code: str = ""
    etag: str | None = None  # the provider's list when refused


@dataclass
class Syncer:
    """The agent's pass; one instance per agent (its memory: the last list, its tag, refused creates)."""

    rest: Rest
    claims: Informer
    secrets: Informer
    provider: Provider
    events: ClaimEvents
    clock: Clock = utcnow
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    refused_retry: timedelta = REFUSED_RETRY
    last_sync: datetime | None = None  # when a pass last heard from the provider
    etag: str | None = None
    items: dict[str, View] = field(default_factory=dict)
    _refused: dict[str, _Refused] = field(default_factory=dict)  # claim key -> its last refused create
    _undelete_refused: dict[str, _Refused] = field(default_factory=dict)  # ... and refused undelete

    def run_pass(self) -> PassResult:
        claims = list(self._parsed(self.claims.list()))
        now = self.clock()
        try:
            answer = self.provider.list(self.etag)
        except (ProviderError, ProviderUnreachable) as exc:
            self._provider_away(claims, exc, now)
            return PassResult(reachable=False, retry_after=getattr(exc, "retry_after", None))
        if answer.items is not None:
            self.items, self.etag = answer.items, answer.etag
        self.last_sync = now
        self.metrics.last_sync.set(now.timestamp())
        owners = _id_owners(claims)
        result = PassResult()
        for claim in claims:
            try:
                if owners.get(database_id(claim)) != claim.key:
                    self._conflict(claim, now)
                elif claim.metadata.deleting:
                    self._delete(claim, now)
                else:
                    result.again_soon |= self._sync(claim, now)
            except (ProviderError, ProviderUnreachable) as exc:
                if isinstance(exc, ProviderError) and not exc.transient and exc.status != 401:
                    log.warning("claim %s: the provider answered %s %s", claim.key, exc.status, exc.code)
                else:
                    self._provider_away([claim], exc, now)
                result.again_soon = True
            except ApiException as exc:  # the consumer cluster's apiserver: a conflict or a hiccup, next pass
                log.warning("claim %s: write failed (%s)", claim.key, exc.status)
                result.again_soon = True
        return result

    # -- one claim -------------------------------------------------------------------------------

    def _sync(self, claim: ClaimObject, now: datetime) -> bool:
        """Create, follow and keep the Secret of one live claim; True if it wants another pass soon."""
        db_id = database_id(claim)
        claim = self._with_finalizer(claim)
        view = self.items.get(db_id)
        if view is None:
            view = self._create(claim, db_id, now)
            if view is None:
                return False
        report = _Report(claim, now).reachable().of_view(db_id, view)
        again = False
        if view.get("deleteRequestedAt"):
            self._deleting(claim, db_id, view, report)
        elif view.get("phase") == "Ready":
            again = self._keep_secret(claim, db_id, view, report)
        else:
            reason = view.get("reason") or view.get("phase") or "Provisioning"
            report.condition(READY, False, reason, f"the database is {str(view.get('phase')).lower()}")
        self._write_status(report)
        return again

    def _refused_lately(self, memory: dict[str, _Refused], claim: ClaimObject, now: datetime) -> bool:
        """Refused a moment ago, and nothing it depends on changed since: not asked again yet."""
        refused = memory.get(claim.key)
        if refused is None or refused.generation != claim.metadata.generation or now - refused.at >= self.refused_retry:
            return False
        return refused.code not in RETRY_ON_CHANGE or refused.etag == self.etag

    def _create(self, claim: ClaimObject, db_id: str, now: datetime) -> View | None:
        if self._refused_lately(self._refused, claim, now):
            self._write_status(_Report(claim, now).reachable())
            return None
        try:
            view = self.provider.ensure(db_id, claim.spec.size_class)
        except ProviderError as exc:
            if exc.transient or exc.status == 401:
                raise
            reason = REFUSALS.get(exc.code, "Refused")
            self._refused[claim.key] = _Refused(claim.metadata.generation, now, exc.code, self.etag)
            report = _Report(claim, now).reachable()
            report.fields(phase=ClaimPhase.PENDING, database_id=db_id)
            report.condition(READY, False, reason, f"the provider refused the database ({exc.code})")
            if self._write_status(report):
                self.events.record(claim, reason, f"the provider refused database {db_id} ({exc.code})", warning=True)
            return None
        self._refused.pop(claim.key, None)
        self._undelete_refused.pop(claim.key, None)
        self.items[db_id] = view
        self.events.record(claim, "Created", f"database {db_id} requested from the provider")
        return view

    def _deleting(self, claim: ClaimObject, db_id: str, view: View, report: _Report) -> None:
        """The claim's database is being deleted. A claim that never had its Secret (one re-created after its
        predecessor was deleted) asks the provider to undo the delete; where that is refused it waits, and
        once the database is dropped the claim gets a new one. A claim that had the database's Secret never
        undoes a delete made out from under it (by an operator, or the API directly)."""
        owned_before = claim.status.binding is not None
        if not owned_before and not self._refused_lately(self._undelete_refused, claim, report.now):
            try:
                restored = self.provider.undelete(db_id)
            except ProviderError as exc:
                if exc.transient or exc.status == 401:
                    raise
                before = self._undelete_refused.get(claim.key)
                self._undelete_refused[claim.key] = _Refused(claim.metadata.generation, report.now, exc.code, self.etag)
                if before is None or before.code != exc.code:
                    refusal = f"the provider refused to undelete {db_id} ({exc.code})"
                    self.events.record(claim, "UndeleteRefused", refusal, warning=True)
            else:
                self._undelete_refused.pop(claim.key, None)
                self.items[db_id] = restored
                report.of_view(db_id, restored)
                report.condition(READY, False, "Undeleting", f"the provider is bringing database {db_id} back")
                self.events.record(claim, "Undeleted", f"the delete of database {db_id} was undone")
                return
        drop_after = view.get("dropAfter") or "the end of the retention window"
        message = f"database {db_id} is being deleted until {drop_after}; this claim gets a new database after that"
        refused = None if owned_before else self._undelete_refused.get(claim.key)
        if refused is None:
            report.condition(READY, False, "DatabaseDeleting", message)
            return
        why = UNDELETE_REFUSALS.get(refused.code, f"the provider refused to undo the delete ({refused.code})")
        reason = "QuotaExceeded" if refused.code == "quota_exceeded" else "DatabaseDeleting"
        report.condition(READY, False, reason, f"{message} ({why})")

    def _keep_secret(self, claim: ClaimObject, db_id: str, view: View, report: _Report) -> bool:
        """The Secret at the provider's credentialsVersion (fetched only when it moved); True: try again soon."""
        name = secret_name(claim)
        secret = self.secrets.get(f"{claim.metadata.namespace}/{name}")
        if secret is not None and not is_claims_secret(secret, claim):
            report.condition(READY, False, "SecretConflict", f"Secret {name} exists and is not this claim's")
            return False
        self._rotate_if_asked(claim, db_id, view, report)
        version = view.get("credentialsVersion")
        if version is None:
            report.condition(CURRENT, False, "CredentialsPending", "the provider has no credentials to hand out yet")
            report.condition(READY, False, "CredentialsPending", "waiting for the credentials")
            return True
        if secret is None or secret_version(secret) != version:
            try:
                credentials = self.provider.credentials(db_id)
            except ProviderError as exc:
                if exc.code != "credentials_unavailable":
                    raise
                report.condition(CURRENT, False, "CredentialsPending", "a new password is being set")
                return True
            desired = binding_secret(claim, binding_data(credentials), version)
            if not self._write_secret(claim, secret, desired, report):
                return False
            self.events.record(claim, "SecretWritten", f"Secret {name} holds credentials version {version}")
        self._roll_deployments(claim, version, report)
        pending = bool(view.get("rotationPending"))
        report.condition(
            CURRENT,
            not pending,
            "RotationPending" if pending else "Current",
            "a new password is being set" if pending else f"Secret {name} holds the provider's credentials",
        )
        report.condition(READY, True, "Ready", f"Secret {name} holds working credentials")
        report.fields(binding=ClaimBinding(name=name), credentials_version=version)
        return pending

    def _roll_deployments(self, claim: ClaimObject, version: str, report: _Report) -> None:
        """Roll spec.rolloutDeployments when the Secret's values changed since the status last said (a first
        Secret rolls nothing: pods waiting for it start on their own). Until the status holds `version`
        a pass tries again; a repeated patch rolls nothing twice (agent.rollout)."""
        names = claim.spec.rollout_deployments
        if not names:
            report.without_condition(ROLLED)
            return
        if claim.status.credentials_version in (None, version):
            return
        namespace = claim.metadata.namespace or ""
        outcome = roll(self.rest, namespace, names, version)
        self.metrics.rollouts.labels(outcome="rolled").inc(len(outcome.rolled))
        self.metrics.rollouts.labels(outcome="not_found").inc(len(outcome.missing))
        self.metrics.rollouts.labels(outcome="forbidden").inc(len(outcome.forbidden))
        rolled = f"Deployments {', '.join(outcome.rolled)} rolled" if outcome.rolled else "no Deployment rolled"
        if outcome.rolled:
            self.events.record(claim, "DeploymentsRolled", f"{rolled} for credentials version {version}")
        if outcome.missing or outcome.forbidden:
            reason, names, what = (
                ("DeploymentNotFound", outcome.missing, "no Deployment")
                if outcome.missing
                else ("DeploymentForbidden", outcome.forbidden, "the agent may not patch Deployment")
            )
            message = f"{what} {', '.join(names)} in {namespace}; {rolled} for credentials version {version}"
            report.condition(ROLLED, False, reason, message)
            self.events.record(claim, reason, message, warning=True)
        else:
            report.condition(ROLLED, True, "Rolled", f"{rolled} for credentials version {version}")

    def _write_secret(self, claim: ClaimObject, existing: Obj | None, desired: Obj, report: _Report) -> bool:
        """Create or update the claim's Secret; False (the claim told why) if it cannot be written now."""
        name = desired["metadata"]["name"]
        action = "create"
        try:
            if existing is None:
                try:
                    self.rest.create(SECRETS, desired, claim.metadata.namespace)
                    self.metrics.secret_writes.labels(action="create").inc()
                    return True
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                existing = self.rest.get(SECRETS, name, claim.metadata.namespace)  # ours, the cache behind?
                if not is_claims_secret(existing, claim):
                    report.condition(READY, False, "SecretConflict", f"Secret {name} exists and is not this claim's")
                    return False
            action = "update"
            if differs(existing, desired):
                self.rest.replace(SECRETS, merged(existing, desired))
                self.metrics.secret_writes.labels(action="update").inc()
            return True
        except ApiException as exc:
            if exc.status == 409:  # a write conflict: the next pass, soon, writes on the fresh object
                raise
            self.metrics.secret_write_failures.labels(action=action).inc()
            log.warning("claim %s: Secret %s could not be written (%s)", claim.key, name, exc.status)
            message = f"Secret {name} could not be written (HTTP {exc.status}); retried every poll"
            report.condition(READY, False, "SecretWriteFailed", message)
            return False

    def _rotate_if_asked(self, claim: ClaimObject, db_id: str, view: View, report: _Report) -> None:
        """POST rotate for a new rotate annotation value, or when the rotation interval has passed."""
        asked = claim.metadata.annotations.get(ANNOTATION_CLAIM_ROTATE)
        last = claim.status.last_rotation_time
        if last is None:  # first Ready: the password is new; the interval counts from here
            report.fields(last_rotation_time=report.now, rotation_requested=asked)
            return
        interval = claim.spec.rotation.interval if claim.spec.rotation else None
        due = interval is not None and report.now - last >= interval
        if not due and (not asked or asked == claim.status.rotation_requested):
            return
        rotation = claim.spec.rotation or ClaimRotation()
        self.provider.rotate(db_id, rotation.overlap_seconds)
        report.fields(rotation_requested=asked, last_rotation_time=report.now)
        why = "interval" if due else "annotation"
        self.events.record(claim, "RotationRequested", f"a new password for {db_id} was asked for ({why})")
        view["rotationPending"] = True

    def _delete(self, claim: ClaimObject, now: datetime) -> None:
        if FINALIZER_CLAIM not in claim.metadata.finalizers:
            return
        db_id = database_id(claim)
        if ANNOTATION_CLAIM_DETACH in claim.metadata.annotations:
            self.events.record(claim, "Detached", f"claim let go without the provider; database {db_id} is left")
        elif claim.spec.deletion_policy == DeletionPolicy.ORPHAN:
            self._release_secret(claim)
            self.events.record(claim, "Orphaned", f"database {db_id} and Secret {secret_name(claim)} are left")
        else:
            view = self.items.get(db_id)
            if view is None or not view.get("deleteRequestedAt"):
                # Sent also when the last list lacks the database: it may have been created since (a create
                # whose answer was lost, a list from a replica behind). A 404 or 410 means it is gone.
                view = self.provider.delete(db_id)
                if view is not None:
                    self.items[db_id] = view
                    self.events.record(claim, "DeleteRequested", f"database {db_id} drops after {view['dropAfter']}")
            if view is not None:
                report = _Report(claim, now).reachable().of_view(db_id, view)
                report.condition(DELETING, True, "DeleteRequested", "the provider accepted the delete")
                self._write_status(report)
            self._delete_secret(claim)
        self._remove_finalizer(claim)

    def _conflict(self, claim: ClaimObject, now: datetime) -> None:
        db_id = database_id(claim)
        if claim.metadata.deleting:
            self._remove_finalizer(claim)
            return
        report = _Report(claim, now)
        report.fields(phase=ClaimPhase.PENDING)
        # Not naming the other claim: it may be in a namespace whose users must not learn of it.
        report.condition(READY, False, "DatabaseIdConflict", f"an older claim has databaseId {db_id}")
        if self._write_status(report):
            self.events.record(claim, "DatabaseIdConflict", f"databaseId {db_id} is claimed already", warning=True)

    def _provider_away(self, claims: Iterable[ClaimObject], exc: Exception, now: datetime) -> None:
        unauthorized = isinstance(exc, ProviderError) and exc.status in (401, 403)
        reason = "Unauthorized" if unauthorized else "ProviderUnavailable"
        detail = f"{exc.status} {exc.code}" if isinstance(exc, ProviderError) else str(exc)
        heard = f"it last answered at {format_time(self.last_sync)}" if self.last_sync else "no answer yet"
        message = f"the provider did not answer ({detail}); {heard}; the Secret is kept"
        for claim in claims:
            report = _Report(claim, now)
            report.condition(REACHABLE, False, reason, message)
            try:
                self._write_status(report, refresh=False)
            except ApiException as write_error:
                log.warning("claim %s: status write failed (%s)", claim.key, write_error.status)

    # -- writes to the consumer cluster ----------------------------------------------------------

    def _with_finalizer(self, claim: ClaimObject) -> ClaimObject:
        if FINALIZER_CLAIM in claim.metadata.finalizers:
            return claim
        finalizers = [*claim.metadata.finalizers, FINALIZER_CLAIM]
        patched = self._patch_finalizers(claim, finalizers)
        return ClaimObject.parse(patched)

    def _remove_finalizer(self, claim: ClaimObject) -> None:
        if FINALIZER_CLAIM in claim.metadata.finalizers:
            self._patch_finalizers(claim, [f for f in claim.metadata.finalizers if f != FINALIZER_CLAIM])

    def _patch_finalizers(self, claim: ClaimObject, finalizers: list[str]) -> Obj:
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": claim.metadata.resource_version}}
        return self.rest.patch(CLAIMS, claim.name, patch, claim.metadata.namespace)

    def _release_secret(self, claim: ClaimObject) -> None:
        """Orphan: the claim's owner reference off its Secret, so the Secret outlives the claim."""
        secret = self.secrets.get(f"{claim.metadata.namespace}/{secret_name(claim)}")
        if secret is None or not is_claims_secret(secret, claim):
            return
        kept = without_owner(secret, claim)
        if kept is not None:
            version = secret["metadata"].get("resourceVersion")
            patch = {"metadata": {"ownerReferences": kept, "resourceVersion": version}}
            try:
                self.rest.patch(SECRETS, secret_name(claim), patch, claim.metadata.namespace)
            except ApiException as exc:
                if exc.status != 409:
                    self.metrics.secret_write_failures.labels(action="release").inc()
                raise
            self.metrics.secret_writes.labels(action="release").inc()

    def _delete_secret(self, claim: ClaimObject) -> None:
        """Delete: the claim's Secret goes with it (at once, not only when the garbage collector comes)."""
        secret = self.secrets.get(f"{claim.metadata.namespace}/{secret_name(claim)}")
        if secret is None or not is_claims_secret(secret, claim):
            return
        try:
            self.rest.delete(SECRETS, secret_name(claim), claim.metadata.namespace)
            self.metrics.secret_writes.labels(action="delete").inc()
        except ApiException as exc:
            if exc.status != 404:
                self.metrics.secret_write_failures.labels(action="delete").inc()
                raise

    def _write_status(self, report: _Report, *, refresh: bool = True) -> bool:
        """Write the claim's status if it changed; True if written. lastSyncTime is set with it when the
        change comes from the provider's answer (`refresh`), never on its own: nothing changed, nothing written."""
        claim = report.result()
        if claim.status_body() == dict(claim.stored_status):
            return False
        if refresh:
            claim = claim.with_status(last_sync_time=report.now)
        body = {
            "apiVersion": report.claim_obj_api_version,
            "kind": "DatabaseClaim",
            "metadata": {
                "name": claim.name,
                "namespace": claim.metadata.namespace,
                "resourceVersion": claim.metadata.resource_version,
            },
            "spec": claim.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
            "status": claim.status_body(),
        }
        self.rest.replace(CLAIMS, body, subresource="status")
        self.metrics.status_writes.inc()
        return True

    def _parsed(self, objects: Iterable[Obj]) -> Iterable[ClaimObject]:
        for obj in objects:
            try:
                yield ClaimObject.parse(obj)
            except (ValidationError, InvalidName):
                log.warning("claim %s/%s does not validate; skipped", *_namespace_name(obj))


class _Report:
    """A claim's new status, built up during its sync (the models are frozen: each change is a copy)."""

    claim_obj_api_version = CLAIMS.api_version

    def __init__(self, claim: ClaimObject, now: datetime) -> None:
        self.claim = claim.with_status(observed_generation=claim.metadata.generation)
        self.now = now

    def reachable(self) -> _Report:
        return self.condition(REACHABLE, True, "Reachable", "the provider answered")

    def of_view(self, db_id: str, view: View) -> _Report:
        drop_after = parse_time(view.get("dropAfter"))
        phase = ClaimPhase.DELETING if view.get("deleteRequestedAt") else PHASES.get(str(view.get("phase")))
        return self.fields(database_id=db_id, phase=phase or ClaimPhase.PROVISIONING, drop_after=drop_after)

    def fields(self, **values: Any) -> _Report:
        self.claim = self.claim.with_status(**values)
        return self

    def condition(self, type_: str, status: bool, reason: str, message: str) -> _Report:
        self.claim = self.claim.with_condition(type_, status, reason, message, now=self.now)
        return self

    def without_condition(self, type_: str) -> _Report:
        conditions, changed = without_condition(self.claim.status.conditions, type_)
        if changed:
            self.claim = self.claim.with_status(conditions=conditions)
        return self

    def result(self) -> ClaimObject:
        return self.claim


def _id_owners(claims: Iterable[ClaimObject]) -> dict[str, str]:
    """databaseId -> the key of the claim that has it: the oldest claim naming it (then by uid)."""
    owners: dict[str, tuple[str, str, str]] = {}
    for claim in claims:
        db_id = database_id(claim)
        rank = (claim.metadata.creation_timestamp or "", claim.metadata.uid or "", claim.key)
        if db_id not in owners or rank < owners[db_id]:
            owners[db_id] = rank
    return {db_id: rank[2] for db_id, rank in owners.items()}


def _namespace_name(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))
