"""The Ready path: SQL only for the database's own inputs (a pending password, a rotation request,
a resize); otherwise nothing is run and nothing is written. ConnectionLimitDrift reports an install
config that now resolves another limit, without SQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from domain.config import InstallConfig, UnknownSizeClass
from domain.constants import (
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_OVERLAP,
    ANNOTATION_ROTATE_REQUESTED_AT,
    DatabaseConditionType,
    DatabaseReason,
    DriftReason,
    Phase,
)
from domain.credentials import new_password, password_patch
from domain.resources import DATABASES
from informers import SECRETS, Rest
from reconciler.database import secret as credentials
from reconciler.database.report import Reporter
from reconciler.database.shard_sql import ShardSql
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites, conditional
from reconciler.runtime import ensure_active
from reconciler.sql.login_roles import hand_out, other_login, retire_login
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import set_connection_limit

log = logging.getLogger(__name__)
READY_MESSAGE = "tenant exists on the shard"  # the Ready condition's message (settled.py compares it)


@dataclass(frozen=True)
class ReadyWork:
    """The SQL a Ready database needs: a pending password, a requested rotation, a resize."""

    pending: bool
    rotation: str | None
    rotate_requested: bool
    resize: bool
    end_sessions: bool = False  # the requested rotation ends the sessions of the old credentials
    overlap: int = 0  # seconds the requested rotation keeps the old credentials working (0: none)

    @classmethod
    def of(cls, database: Database, secret: dict[str, Any]) -> ReadyWork:
        rotation = database.annotations.get(ANNOTATION_ROTATE_REQUESTED_AT)
        requested = rotation is not None and rotation != database.status.rotation_applied
        end_sessions = requested and database.annotations.get(ANNOTATION_ROTATE_END_SESSIONS) == rotation
        return cls(
            pending=credentials.password_pending(database, secret),
            rotation=rotation,
            rotate_requested=requested,
            resize=database.spec.size_class != (database.status.applied_size_class or ""),
            end_sessions=end_sessions,
            overlap=0 if end_sessions or not requested else overlap_seconds(database.annotations),
        )

    @property
    def any(self) -> bool:
        return self.pending or self.rotate_requested or self.resize


def overlap_seconds(annotations: dict[str, str]) -> int:
    """The overlap the API recorded with the rotate request (0: none, or a value that is not one)."""
    raw = annotations.get(ANNOTATION_ROTATE_OVERLAP) or ""
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else 0


def login_of(database: Database) -> str:
    """The login role handed out: the tenant role, or its alternate after a rotation with an overlap."""
    return database.status.login_role or database.tenant


def set_drift(config: InstallConfig, database: Database, report: Reporter) -> None:
    """ConnectionLimitDrift: the install config now resolves another limit (or no class at all)."""
    size_class = database.spec.size_class
    applied = database.status.applied_connection_limit
    try:
        wanted = config.resolve_connection_limit(size_class)
    except UnknownSizeClass:
        reason, message = DriftReason.UNKNOWN_SIZE_CLASS, f"size class {size_class!r} is no longer configured"
    else:
        if applied is None or wanted == applied:
            database.remove_condition(DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
            return
        reason = DriftReason.CONFIG_CHANGED
        message = (
            f"install config resolves connection limit {wanted}, the role has {applied}; change "
            "spec.sizeClass to apply a new limit"
        )
    before = database.reason(DatabaseConditionType.CONNECTION_LIMIT_DRIFT)
    database.set_condition(DatabaseConditionType.CONNECTION_LIMIT_DRIFT, True, reason, message)
    if before != reason:  # the database stays Ready, but the operator should know once
        report.change_event(database, reason, message, warning=True)


@dataclass
class ReadyPath:
    """A Ready database: rotation, resize and drift; the resync fast path writes and runs nothing."""

    config: InstallConfig
    rest: Rest
    secrets: credentials.CredentialsSecrets
    sql: ShardSql
    writes: DatabaseWrites
    report: Reporter
    clock: Callable[[], datetime]

    def converge(self, database: Database, shard: dict[str, Any], secret: dict[str, Any]) -> float | None:
        """Converge; the seconds until an overlap ends (its pass retires the previous login), else None."""
        work = ReadyWork.of(database, secret)
        if work.any:
            # Re-read both from the apiserver before SQL that must run once: the caches may not show
            # this replica's own last writes yet (another watch stream), and acting on them could
            # rotate a password or alter a limit a second time.
            database.load(self.rest.get(DATABASES, database.name, database.namespace))
            secret = self.secrets.reread(database, secret)
            work = ReadyWork.of(database, secret)
        if work.rotate_requested and not work.pending:
            ensure_active()
            # With an overlap the new password goes on the other login role, named in the same patch:
            # the Secret says which role the pending password is for, whatever happens before the SQL.
            user = other_login(database.tenant, credentials.user(secret)) if work.overlap else None
            patch = conditional(password_patch(new_password(), user), secret)
            secret = self.rest.patch(SECRETS, credentials.secret_name(database), patch, database.namespace)
        if work.pending or work.rotate_requested:
            self._rotate(database, shard, secret, work)
        if work.resize:
            self._resize(database, shard)
        wait = self._retire(database, shard)
        database.update(observed_generation=database.generation)
        self.report.ready(database, True, DatabaseReason.PROVISIONED, READY_MESSAGE)
        set_drift(self.config, database, self.report)
        self.writes.status(database)
        return wait

    def _rotate(self, database: Database, shard: dict[str, Any], secret: dict[str, Any], work: ReadyWork) -> None:
        """Set the Secret's (new) password on the Secret's login role; end its sessions if the request says
        so. A new login role keeps the previous one working for the overlap; without one (or with
        terminateSessions) the previous one stops at once."""
        tenant, password, login = database.tenant, credentials.password(secret), credentials.user(secret)
        limit = database.status.applied_connection_limit
        assert limit is not None  # Ready: the limit is applied
        overlap = work.overlap if login != login_of(database) else 0
        end_sessions = work.end_sessions

        def rotate(session: AdminSession) -> None:
            hand_out(session, tenant, login, password, limit, end_sessions=end_sessions, retire_other=not overlap)

        self.sql.run(database, shard, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE, rotate)
        credentials.password_applied(database, secret)
        retire_at = self.clock() + timedelta(seconds=overlap) if overlap else None
        database.update(login_role=None if login == tenant else login, retire_login_at=retire_at)
        if work.rotation is not None:
            database.update(rotation_applied=work.rotation)
        log.info("credentials rotated", extra={"database": database.name, "shard": database.shard})

    def _retire(self, database: Database, shard: dict[str, Any]) -> float | None:
        """At the end of an overlap: the previous login role loses its login and password; before it, the
        seconds left."""
        retire_at = database.status.retire_login_at
        if retire_at is None:
            return None
        left = (retire_at - self.clock()).total_seconds()
        if left > 0:
            return left
        tenant, previous = database.tenant, other_login(database.tenant, login_of(database))

        def retire(session: AdminSession) -> None:
            retire_login(session, tenant, previous)

        self.sql.run(database, shard, Phase.READY, DatabaseReason.ADMIN_UNAVAILABLE, retire)
        database.update(retire_login_at=None)
        log.info("previous login retired", extra={"database": database.name, "shard": database.shard})
        return None

    def _resize(self, database: Database, shard: dict[str, Any]) -> None:
        """Apply the new size class's connection limit (an unknown class is reported as drift)."""
        try:
            limit = self.config.resolve_connection_limit(database.spec.size_class)
        except UnknownSizeClass:
            return  # reported as drift (UnknownSizeClass); nothing to apply
        if limit != database.status.applied_connection_limit:
            tenant = database.tenant

            def resize(session: AdminSession) -> None:
                set_connection_limit(session, tenant, limit)

            self.sql.run(database, shard, Phase.READY, DatabaseReason.SET_LIMIT_FAILED, resize)
        database.update(applied_size_class=database.spec.size_class, applied_connection_limit=limit)
