"""What a pass reports: the Ready condition, Events, and failures that end the pass."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NoReturn

from domain.constants import DatabaseConditionType, DatabaseReason, Phase
from reconciler.database.state import Pass
from reconciler.database.writes import DatabaseWrites
from reconciler.events import EventRecorder
from reconciler.runtime import ReconcileError, TerminalError

log = logging.getLogger(__name__)


@dataclass
class Reporter:
    """Status conditions, Events and failures of a pass (every failure path goes through `fail`)."""

    writes: DatabaseWrites
    events: EventRecorder

    def event(self, p: Pass, reason: str, what: str, *, warning: bool = False) -> None:
        """An Event about the database, now: `what` and who (consumer, externalId, shard).

        For a change already written (Created after the placement's status write, ...); an Event
        about a change still to be written goes through `change_event`.
        """
        self.events.record(p.db, reason, f"{what} ({p.describe()})", warning=warning)

    def change_event(self, p: Pass, reason: str, what: str, *, warning: bool = False) -> None:
        """An Event about a status change of this pass: sent once the status write recording it
        succeeded, dropped if it fails (the next pass sees the old status and decides it again)."""
        describe = p.describe()  # who, as the pass saw it when deciding
        p.after_write(lambda: self.events.record(p.db, reason, f"{what} ({describe})", warning=warning))

    def ready(self, p: Pass, ready: bool, reason: str, message: str) -> bool:
        """Set the Ready condition; a new failure reason also becomes a Warning event (sent after the
        status write that records it)."""
        before = p.reason(DatabaseConditionType.READY)
        changed = p.set_condition(DatabaseConditionType.READY, ready, reason, message)
        if not ready and before != reason and reason not in (DatabaseReason.PROVISIONING, DatabaseReason.DELETING):
            self.change_event(p, reason, message, warning=True)
        return changed

    def fail(
        self,
        p: Pass,
        phase: Phase,
        reason: str,
        message: str,
        *,
        terminal: bool = False,
        requeue_after: float | None = None,
    ) -> NoReturn:
        """Record a failure in status, then raise: retried with backoff, or (terminal) not."""
        p.update(phase=phase)
        self.ready(p, False, reason, message)
        self.writes.status(p)
        log.warning("database not ready", extra={"database": p.name, "reason": reason, "detail": message})
        if terminal:
            raise TerminalError(reason, message, requeue_after=requeue_after)
        raise ReconcileError(reason, message)
