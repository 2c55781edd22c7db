"""What a pass reports: the Ready condition, Events, and failures that end the pass."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from domain.constants import DatabaseConditionType, DatabaseReason, Phase
from reconciler.database.state import Database
from reconciler.database.writes import DatabaseWrites
from reconciler.events import EventRecorder
from reconciler.runtime import ReconcileError, TerminalError

log = logging.getLogger(__name__)


class Waiting(Exception):
    """Ends a pass that waits for something outside the Database (its shard is not Ready): the status
    says so already; this is no failure (no backoff, no error counted). The controller looks again
    after `requeue_after` seconds, and at once when the awaited object changes (a Shard that turns
    Ready enqueues its databases)."""

    def __init__(self, reason: str, message: str, requeue_after: float) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.requeue_after = requeue_after


@dataclass
class Reporter:
    """Status conditions, Events and failures of a pass (every failure path raises what `failure` returns)."""

    writes: DatabaseWrites
    events: EventRecorder

    def event(self, database: Database, reason: str, what: str, *, warning: bool = False) -> None:
        """An Event about the database, now: `what` and who (consumer, externalId, shard).

        For a change already written (Created after the placement's status write, ...); an Event
        about a change still to be written goes through `change_event`.
        """
        self.events.record(database.db, reason, f"{what} ({database.describe()})", warning=warning)

    def change_event(self, database: Database, reason: str, what: str, *, warning: bool = False) -> None:
        """An Event about a status change of this pass: sent once the status write recording it
        succeeded, dropped if it fails (the next pass sees the old status and decides it again)."""
        describe = database.describe()  # who, as the pass saw it when deciding
        database.after_write(lambda: self.events.record(database.db, reason, f"{what} ({describe})", warning=warning))

    def ready(self, database: Database, ready: bool, reason: str, message: str) -> bool:
        """Set the Ready condition; a new failure reason also becomes a Warning event (sent after the
        status write that records it)."""
        before = database.reason(DatabaseConditionType.READY)
        changed = database.set_condition(DatabaseConditionType.READY, ready, reason, message)
        if not ready and before != reason and reason not in (DatabaseReason.PROVISIONING, DatabaseReason.DELETING):
            self.change_event(database, reason, message, warning=True)
        return changed

    def failure(
        self,
        database: Database,
        phase: Phase,
        reason: str,
        message: str,
        *,
        terminal: bool = False,
        requeue_after: float | None = None,
        retry_cap: float | None = None,
    ) -> ReconcileError:
        """Record a failure in status and return the exception the caller raises:
        `raise report.failure(...)` is retried with backoff (at most `retry_cap` apart), or (terminal) not."""
        database.update(phase=phase)
        self.ready(database, False, reason, message)
        self.writes.status(database)
        log.warning("database not ready", extra={"database": database.name, "reason": reason, "detail": message})
        if terminal:
            return TerminalError(reason, message, requeue_after=requeue_after)
        return ReconcileError(reason, message, retry_cap=retry_cap)

    def terminal(self, database: Database, reason: str, message: str) -> ReconcileError:
        """A failure retrying cannot cure (the spec or an annotation must change): phase Failed, no
        backoff; `raise report.terminal(...)`."""
        return self.failure(database, Phase.FAILED, reason, message, terminal=True)

    def waiting(self, database: Database, phase: Phase, reason: str, message: str, requeue_after: float) -> Waiting:
        """Record that the pass waits (phase kept, Ready False with `reason`) and return what the caller
        raises: `raise report.waiting(...)` ends the pass without an error."""
        database.update(phase=phase)
        self.ready(database, False, reason, message)
        self.writes.status(database)
        log.info("database waiting", extra={"database": database.name, "reason": reason, "detail": message})
        return Waiting(reason, message, requeue_after)
