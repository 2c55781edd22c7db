"""The Ready path: SQL only for the database's own inputs (a pending password, a rotation request,
a resize); otherwise nothing is run and nothing is written. ConnectionLimitDrift reports an install
config that now resolves another limit, without SQL."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import (
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_REQUESTED_AT,
    DatabaseConditionType,
    DatabaseReason,
    DriftReason,
    Phase,
)
from domain.credentials import new_password, password_patch
from informers import SECRETS, Rest
from reconciler.database import secret as credentials
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Pass
from reconciler.database.writes import DatabaseWrites, conditional
from reconciler.resources import DATABASES
from reconciler.runtime import ensure_active
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import set_connection_limit, set_password

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadyWork:
    """The SQL a Ready database needs: a pending password, a requested rotation, a resize."""

    pending: bool
    rotation: str | None
    rotate_requested: bool
    resize: bool

    @classmethod
    def of(cls, p: Pass, secret: dict[str, Any]) -> ReadyWork:
        rotation = p.annotations.get(ANNOTATION_ROTATE_REQUESTED_AT)
        return cls(
            pending=credentials.password_pending(p, secret),
            rotation=rotation,
            rotate_requested=rotation is not None and rotation != p.status.rotation_applied,
            resize=p.spec.size_class != (p.status.applied_size_class or ""),
        )

    @property
    def any(self) -> bool:
        return self.pending or self.rotate_requested or self.resize


def set_drift(config: InstallConfig, p: Pass, report: Reporter) -> None:
    """ConnectionLimitDrift: the install config now resolves another limit (or no class at all)."""
    size_class = p.spec.size_class
    applied = p.status.applied_connection_limit
    try:
        wanted = config.resolve_connection_limit(size_class)
    except UnknownSizeClass:
        reason, message = DriftReason.UNKNOWN_SIZE_CLASS, f"size class {size_class!r} is no longer configured"
    else:
        if applied is None or wanted == applied:
            p.remove_condition(DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
            return
        reason = DriftReason.CONFIG_CHANGED
        message = (
            f"install config resolves connection limit {wanted}, the role has {applied}; change "
            "spec.sizeClass to apply a new limit"
        )
    before = p.reason(DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
    p.set_condition(DatabaseConditionType.CONNECTION_LIMIT_DRIFT, True, reason, message)
    if before != reason:  # the database stays Ready, but the operator should know once
        report.change_event(p, reason, message, warning=True)


@dataclass
class ReadyPath:
    """A Ready database: rotation, resize and drift; the resync fast path writes and runs nothing."""

    config: InstallConfig
    rest: Rest
    secrets: credentials.CredentialsSecrets
    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter

    def converge(self, p: Pass, shard: dict[str, Any], secret: dict[str, Any]) -> None:
        work = ReadyWork.of(p, secret)
        if work.any:
            # Re-read both from the apiserver before SQL that must run once: the caches may not show
            # this replica's own last writes yet (another watch stream), and acting on them could
            # rotate a password or alter a limit a second time.
            p.load(self.rest.get(DATABASES, p.name, p.namespace))
            secret = self.secrets.reread(p, secret)
            work = ReadyWork.of(p, secret)
        if work.rotate_requested and not work.pending:
            ensure_active()
            patch = conditional(password_patch(new_password()), secret)
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], patch, p.namespace)
        if work.pending or work.rotate_requested:
            self._rotate(p, shard, secret, work)
        if work.resize:
            self._resize(p, shard)
        p.update(observed_generation=p.generation)
        self.report.ready(p, True, DatabaseReason.PROVISIONED, "tenant exists on the shard")
        set_drift(self.config, p, self.report)
        self.writes.status(p)

    def _rotate(self, p: Pass, shard: dict[str, Any], secret: dict[str, Any], work: ReadyWork) -> None:
        """Set the Secret's (new) password on the role; end its sessions if the request says so."""
        tenant, password = p.tenant, credentials.password(secret)
        end_sessions = work.rotate_requested and p.annotations.get(ANNOTATION_ROTATE_END_SESSIONS) == work.rotation

        def rotate(session: AdminSession) -> None:
            set_password(session, tenant, password, end_sessions=end_sessions)

        self.sql.run(p, shard, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE, rotate)
        credentials.password_applied(p, secret)
        if work.rotation is not None:
            p.update(rotation_applied=work.rotation)
        log.info("credentials rotated", extra={"database": p.name, "shard": shard["metadata"]["name"]})

    def _resize(self, p: Pass, shard: dict[str, Any]) -> None:
        """Apply the new size class's connection limit (an unknown class is reported as drift)."""
        try:
            limit = self.config.resolve_connection_limit(p.spec.size_class)
        except UnknownSizeClass:
            return  # reported as drift (UnknownSizeClass); nothing to apply
        if limit != p.status.applied_connection_limit:
            tenant = p.tenant

            def resize(session: AdminSession) -> None:
                set_connection_limit(session, tenant, limit)

            self.sql.run(p, shard, Phase.READY, DatabaseReason.SET_LIMIT_FAILED, resize)
        p.update(applied_size_class=p.spec.size_class, applied_connection_limit=limit)
