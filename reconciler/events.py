"""Kubernetes Events on Databases: the audit trail (Created, Ready, DeleteRequested, ...).

Messages carry consumer, externalId and shard, and a sanitized error class at most: never a
password, hash or token. Recording is best effort and asynchronous, like client-go's event
broadcaster: `record` queues the Event and sender threads write the queues to the apiserver, so a
reconcile never waits for its audit write (2 of the 6 writes of a new database) while its admin
session idles. The Events of one object always go to the same sender, in the order recorded;
several senders keep up with the Database workers of a whole fleet (`workersTotal` of them: one
sender, one request at a time, fell behind a 20-shard burst and dropped Events). A full queue drops
the Event with a warning; a failed write never fails a reconcile. `close` sends what is queued
(bounded) when the manager stops.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from typing import Any

from domain.events import event_body
from domain.metadata import Identity, ObjectMeta
from informers import EVENTS, Rest
from reconciler.runtime.status import now_rfc3339

log = logging.getLogger(__name__)
COMPONENT = "dbprovider"
QUEUE_SIZE = 1000  # per sender; client-go's broadcaster queue length
SENDERS = 8


class _Marker:
    """A queue entry that only says "everything before me was handled" (for flush)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done


_Entry = dict[str, Any] | _Marker | None  # an Event, a flush marker, or the end of a sender


class EventRecorder:
    def __init__(self, rest: Rest, instance: str, *, queue_size: int = QUEUE_SIZE, senders: int = SENDERS) -> None:
        self.rest = rest
        self.instance = instance
        self._queues: list[queue.Queue[_Entry]] = [queue.Queue(queue_size) for _ in range(senders)]
        self._lock = threading.Lock()
        self._senders: list[threading.Thread] = []
        self._closed = False

    def record(self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Queue an Event about `obj` (returns at once)."""
        meta = ObjectMeta.of(obj)
        if meta.namespace is None:
            raise ValueError(f"an Event is about a namespaced object, not {meta.name}")
        event = self._event(obj, meta, meta.namespace, reason, message, warning)
        lane = zlib.crc32(meta.key.encode()) % len(self._queues)
        with self._lock:
            if self._closed:
                log.warning("event not recorded", extra={"reason": reason, "error": "RecorderClosed"})
                return
            if not self._senders:
                for n, events in enumerate(self._queues):
                    sender = threading.Thread(
                        target=self._send_all, args=(events,), name=f"event-sender-{n}", daemon=True
                    )
                    sender.start()
                    self._senders.append(sender)
            try:
                self._queues[lane].put_nowait(event)
            except queue.Full:
                log.warning("event not recorded", extra={"reason": reason, "error": "QueueFull"})

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued Event was sent (or dropped); False on timeout."""
        with self._lock:
            if not self._senders or self._closed:
                return True
        markers = [_Marker(threading.Event()) for _ in self._queues]
        try:
            for events, marker in zip(self._queues, markers, strict=True):
                events.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return all(marker.done.wait(timeout) for marker in markers)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (at most `timeout` seconds), then stop the senders."""
        with self._lock:
            self._closed = True
            senders = list(self._senders)
        if not senders:
            return
        for events in self._queues:
            try:
                events.put(None, timeout=timeout)
            except queue.Full:
                pass
        for sender in senders:
            sender.join(timeout)

    def _send_all(self, events: queue.Queue[_Entry]) -> None:
        while True:
            event = events.get()
            if event is None:
                return
            if isinstance(event, _Marker):
                event.done.set()
                continue
            try:
                self.rest.create(EVENTS, event, event["metadata"]["namespace"])
            except Exception as exc:  # noqa: BLE001 - events are best effort
                log.warning("event not recorded", extra={"reason": event["reason"], "error": type(exc).__name__})

    def _event(
        self, obj: dict[str, Any], meta: ObjectMeta, namespace: str, reason: str, message: str, warning: bool
    ) -> dict[str, Any]:
        identity = Identity.of(obj)  # apiVersion and kind: "" where absent, sent as null as before
        involved = {
            "apiVersion": identity.api_version or None,
            "kind": identity.kind or None,
            "name": meta.name,
            "namespace": namespace,
            "uid": meta.uid,
            "resourceVersion": meta.resource_version,
        }
        return event_body(
            involved, reason, message, warning=warning, component=COMPONENT, instance=self.instance, now=now_rfc3339()
        )
