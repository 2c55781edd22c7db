"""The event recorder: Events reach the apiserver in order, in the background, best effort.

Runs as the provider's ServiceAccount on the real apiserver (its Role allows Events in the release
namespace only), so the RBAC the manager needs is proven too.
"""

from __future__ import annotations

import logging
import socket

import pytest
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from domain.constants import API_VERSION
from domain.resources import DATABASES
from informers import Rest
from reconciler.database.state import Database
from reconciler.events import EventRecorder
from reconciler.runtime import TerminalError
from tests.reconciler.conftest import NAMESPACE, condition, controller_parts
from tests.support.common import wait_for


def subject(name: str, namespace: str = NAMESPACE) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"},
    }


def events_about(admin_rest: Rest, name: str) -> list[dict]:
    items = admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    mine = [e for e in items if e["involvedObject"]["name"] == name]
    return sorted(mine, key=lambda e: int(e["metadata"]["resourceVersion"]))  # the order they were stored


def test_events_are_sent_in_the_order_recorded(provider_client, admin_rest) -> None:
    recorder = EventRecorder(Rest(provider_client), "test-instance")
    try:
        for i in range(5):
            recorder.record(subject("ordered"), "Step", f"step {i}", warning=i == 4)
        assert recorder.flush(30)
        events = events_about(admin_rest, "ordered")
        assert [e["message"] for e in events] == [f"step {i}" for i in range(5)]
        assert [e["type"] for e in events] == ["Normal"] * 4 + ["Warning"]
        assert events[0]["reportingInstance"] == "test-instance"
        assert events[0]["source"] == {"component": "dbprovider"}
        assert events[0]["involvedObject"]["uid"] == "uid-ordered"
    finally:
        recorder.close()


def test_close_sends_what_is_queued_then_refuses(provider_client, admin_rest, caplog) -> None:
    recorder = EventRecorder(Rest(provider_client), "test-instance")
    for i in range(3):
        recorder.record(subject("closing"), "Step", f"step {i}")
    recorder.close(30)
    assert [e["message"] for e in events_about(admin_rest, "closing")] == ["step 0", "step 1", "step 2"]
    with caplog.at_level(logging.WARNING, logger="reconciler.events"):
        recorder.record(subject("closing"), "Late", "after close")
    assert [r.error for r in caplog.records] == ["RecorderClosed"]
    assert len(events_about(admin_rest, "closing")) == 3


def test_a_rejected_event_is_logged_not_raised(provider_client, caplog) -> None:
    """The provider may not write Events outside its namespace: 403, logged by class, never raised."""
    recorder = EventRecorder(Rest(provider_client), "test-instance")
    try:
        with caplog.at_level(logging.WARNING, logger="reconciler.events"):
            recorder.record(subject("elsewhere", namespace="default"), "Step", "forbidden here")
            assert recorder.flush(30)
        assert [(r.getMessage(), r.reason, r.error) for r in caplog.records] == [
            ("event not recorded", "Step", "ForbiddenException")
        ]
    finally:
        recorder.close()


def test_a_full_queue_drops_instead_of_blocking_the_reconcile(caplog) -> None:
    """An apiserver that does not answer: the queue fills up and record() still returns at once."""
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(16)  # accepts connections in the backlog, never answers
    configuration = Configuration(host=f"http://127.0.0.1:{blackhole.getsockname()[1]}")
    recorder = EventRecorder(Rest(ApiClient(configuration)), "test-instance", queue_size=1)
    try:
        with caplog.at_level(logging.WARNING, logger="reconciler.events"):
            for i in range(4):  # one in flight (stuck), one queued, the rest dropped
                recorder.record(subject("stuck"), "Step", f"step {i}")
        dropped = [r for r in caplog.records if getattr(r, "error", None) == "QueueFull"]
        assert 2 <= len(dropped) <= 3
    finally:
        blackhole.close()  # the stuck request fails now; the sender moves on
        recorder.close(10)


def test_a_status_write_lost_to_a_conflict_sends_no_event(fleet, provider_client, admin_rest) -> None:
    """Another writer changes the Database between the pass's decision (a new failure reason: a
    Warning) and its status write, which gets 409. That pass sends nothing; the next one, seeing
    the old status again, decides the same change anew and sends it once it is written: one Event."""
    name = fleet.database("event-conflict", size_class="no-such-class")  # InvalidSizeClass: terminal
    key = f"{NAMESPACE}/{name}"
    with controller_parts(provider_client) as parts:
        wait_for(lambda: parts.databases.get(key), what="the database cached")
        controller = parts.controller()
        write_status = controller.writes.status
        conflicts: list[int] = []

        def another_writer_first(database: Database) -> None:
            if not conflicts:  # once: the first status write loses the race
                admin_rest.patch(DATABASES, name, {"metadata": {"labels": {"touched": "yes"}}}, NAMESPACE)
            try:
                write_status(database)
            except ApiException as exc:
                conflicts.append(exc.status)
                raise
            conflicts.append(200)

        controller.writes.status = another_writer_first  # type: ignore[method-assign]
        with pytest.raises(ApiException):
            controller.reconcile(key)
        assert conflicts == [409]
        assert parts.events.flush(30)
        assert events_about(admin_rest, name) == []  # the old code had sent InvalidSizeClass here

        def terminal_pass() -> bool:
            """The next pass ends in the terminal failure; while the cache lags the writes it asks for a requeue."""
            try:
                result = controller.reconcile(key)
            except TerminalError:
                return True
            assert result is not None, "the pass ended without the terminal failure"
            return False

        wait_for(terminal_pass, what="the next pass writing the status")
        assert conflicts == [409, 200]
        assert condition(fleet.get_database(name), "Ready")["reason"] == "InvalidSizeClass"
        assert parts.events.flush(30)
        sent = [e for e in events_about(admin_rest, name) if e["reason"] == "InvalidSizeClass"]
        assert [(e["type"], e["count"]) for e in sent] == [("Warning", 1)]


@pytest.fixture(autouse=True)
def _no_leftover_events(admin_rest):
    yield
    for event in admin_rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]:
        if event["involvedObject"]["name"] in ("ordered", "closing"):
            admin_rest.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/events/{event['metadata']['name']}")
