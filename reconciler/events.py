"""Kubernetes Events on Databases: the audit trail (Created, Ready, DeleteRequested, ...).

Messages carry consumer, externalId and shard, and a sanitized error class at most: never a
password, hash or token. Recording is best effort and asynchronous, like client-go's event
broadcaster: `record` queues the Event and one sender thread writes the queue to the apiserver in
order, so a reconcile never waits for its audit write (2 of the 6 writes of a new database) while
its admin session idles. A full queue drops the Event with a warning; a failed write never fails a
reconcile. `close` sends what is queued (bounded) when the manager stops.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from typing import Any

from informers import EVENTS, Rest
from reconciler.runtime.status import now_rfc3339

log = logging.getLogger(__name__)
COMPONENT = "dbprovider"
QUEUE_SIZE = 1000  # client-go's broadcaster queue length


class EventRecorder:
    def __init__(self, rest: Rest, instance: str, *, queue_size: int = QUEUE_SIZE) -> None:
        self.rest = rest
        self.instance = instance
        self._queue: queue.Queue[dict[str, Any] | _Marker | None] = queue.Queue(queue_size)
        self._lock = threading.Lock()
        self._sender: threading.Thread | None = None
        self._closed = False

    def record(self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Queue an Event about `obj` (returns at once)."""
        event = self._event(obj, reason, message, warning)
        with self._lock:
            if self._closed:
                log.warning("event not recorded", extra={"reason": reason, "error": "RecorderClosed"})
                return
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_all, name="event-sender", daemon=True)
                self._sender.start()
            try:
                self._queue.put_nowait(event)
            except queue.Full:
                log.warning("event not recorded", extra={"reason": reason, "error": "QueueFull"})

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued Event was sent (or dropped); False on timeout."""
        done = threading.Event()
        with self._lock:
            if self._sender is None or self._closed:
                return True
        try:
            self._queue.put(_Marker(done), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (at most `timeout` seconds), then stop the sender."""
        with self._lock:
            self._closed = True
            sender = self._sender
        if sender is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        sender.join(timeout)

    def _send_all(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            if isinstance(event, _Marker):
                event.done.set()
                continue
            try:
                self.rest.create(EVENTS, event, event["metadata"]["namespace"])
            except Exception as exc:  # noqa: BLE001 - events are best effort
                log.warning("event not recorded", extra={"reason": event["reason"], "error": type(exc).__name__})

    def _event(self, obj: dict[str, Any], reason: str, message: str, warning: bool) -> dict[str, Any]:
        meta = obj["metadata"]
        now = now_rfc3339()
        return {
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


class _Marker:
    """A queue entry that only says "everything before me was handled" (for flush)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done
