"""Kubernetes Events on Databases: the audit trail (Created, Ready, DeleteRequested, ...).

Messages carry consumer, externalId and shard, and a sanitized error class at most: never a
password, hash or token. Recording is best effort: a failed Event never fails a reconcile.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from informers import EVENTS, Rest
from reconciler.runtime.status import now_rfc3339

log = logging.getLogger(__name__)
COMPONENT = "dbprovider"


class EventRecorder:
    def __init__(self, rest: Rest, instance: str) -> None:
        self.rest = rest
        self.instance = instance

    def record(self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        meta = obj["metadata"]
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.rest.create(EVENTS, event, meta["namespace"])
        except Exception as exc:  # noqa: BLE001 - events are best effort
            log.warning("event not recorded", extra={"reason": reason, "error": type(exc).__name__})
