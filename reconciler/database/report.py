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
        """An Event about the database: `what` and who (consumer, externalId, shard)."""
        self.events.record(p.db, reason, f"{what} ({p.describe()})", warning=warning)

    def ready(self, p: Pass, ready: bool, reason: str, message: str) -> bool:
        """Set the Ready condition; a new failure reason also becomes a Warning event."""
        before = p.reason(DatabaseConditionType.READY)
        changed = p.set_condition(DatabaseConditionType.READY, ready, reason, message)
        if not ready and before != reason and reason not in (DatabaseReason.PROVISIONING, DatabaseReason.DELETING):
            self.event(p, reason, message, warning=True)
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
