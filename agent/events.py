"""Kubernetes Events on claims: what the agent did (Created, SecretWritten, DeleteRequested, ...).

The agent records an Event only when something changed, so they are few; each is one best-effort
create, and a failed write is logged (reason and error class) and never fails a pass. Messages name
databaseIds, Secrets and error codes, never a password or a token.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from domain.constants import API_VERSION, CLAIM_NAMES
from domain.events import event_body
from domain.objects import ClaimObject
from domain.timefmt import format_time
from informers import EVENTS, Rest

log = logging.getLogger(__name__)
COMPONENT = "dbprovider-agent"


class ClaimEvents:
    """Records Events about claims as `instance` (the agent replica)."""

    def __init__(self, rest: Rest, instance: str) -> None:
        self.rest = rest
        self.instance = instance

    def record(self, claim: ClaimObject, reason: str, message: str, *, warning: bool = False) -> None:
        meta = claim.metadata
        involved = {
            "apiVersion": API_VERSION,
            "kind": CLAIM_NAMES.kind,
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
        }
        now = format_time(datetime.now(UTC))
        event = event_body(
            involved, reason, message, warning=warning, component=COMPONENT, instance=self.instance, now=now
        )
        try:
            self.rest.create(EVENTS, event, meta.namespace)
        except Exception as exc:  # noqa: BLE001 - events are best effort
            log.warning("event not recorded", extra={"reason": reason, "error": type(exc).__name__})
