"""The database lifecycle over HTTPS: PUT, GET one / all, isolation, quota, DELETE and rotation."""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime

import pytest
import requests

from api.models import CreateDatabase
from api.store import DatabaseStore
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_OVERLAP,
    ANNOTATION_ROTATE_REQUESTED_AT,
    API_VERSION,
    FINALIZER_TENANT,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
)
from domain.naming import database_object_name, label_value
from domain.resources import DATABASES
from informers import Informer
from tests.api.support import NAMESPACE, ApiEnv, Consumer
from tests.support.common import wait_for

RFC3339_MICROS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def path(external_id: str, suffix: str = "") -> str:
    return f"/v1/databases/{external_id}{suffix}"


def blind_store(env: ApiEnv) -> DatabaseStore:
    """The store of a second replica whose cache has not seen the object yet: an informer never started."""
    return DatabaseStore(
        env.config,
        Informer(env.admin, DATABASES, NAMESPACE),
        env.components.store.consumers,
        env.components.store.secrets,
        env.admin,
    )


def answers(env: ApiEnv, consumer: Consumer, *calls: tuple[str, str, int]) -> requests.Response:
    """Make each (method, external ID, expected status) call in turn; the last response."""
    for method, external_id, status in calls:
        response = env.call(method, path(external_id), consumer.token)
        assert response.status_code == status, f"{method} {external_id}: {response.status_code} {response.text}"
    return response


# -- PUT ------------------------------------------------------------------------------------------


def test_put_creates_then_returns_existing(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    created = env.call("PUT", path("orders"), consumer.token, json={"sizeClass": "small"})
    assert created.status_code == 201, created.text
    view = created.json()
    assert view["externalId"] == "orders"
    assert view["phase"] == "Provisioning"
    assert view["sizeClass"] == "small"
    assert view["connectionLimit"] == 5
    assert view["engine"] == "postgres"
    assert view["deleteRequestedAt"] is None
    assert created.headers["Cache-Control"] == "no-store"

    # The object as the reconciler will find it: named, labelled, held by the tenant finalizer
    # from birth (the controller needs no write to add it), spec set, no status.
    db = env.database(consumer.name, "orders")
    assert db["metadata"]["name"] == database_object_name(consumer.name, "orders")
    assert db["metadata"]["namespace"] == NAMESPACE
    assert db["metadata"]["labels"] == {
        LABEL_CONSUMER: label_value(consumer.name),
        LABEL_EXTERNAL_ID: "orders",
    }
    assert db["metadata"]["finalizers"] == [FINALIZER_TENANT]
    assert db["spec"] == {"consumer": consumer.name, "externalId": "orders", "sizeClass": "small", "engine": "postgres"}
    assert "status" not in db

    # Again, with another body: 200 and the existing database, the body is not applied.
    again = env.call("PUT", path("orders"), consumer.token, json={"sizeClass": "large"})
    assert again.status_code == 200
    assert again.json()["sizeClass"] == "small"
    assert env.database(consumer.name, "orders")["spec"]["sizeClass"] == "small"
    # Right away readable (this replica's own creates are visible before the cache shows them).
    assert env.call("GET", path("orders"), consumer.token).status_code == 200


def test_put_without_body_uses_defaults(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("PUT", path("plain"), consumer.token)
    assert response.status_code == 201
    assert response.json()["sizeClass"] == ""
    assert response.json()["connectionLimit"] == 10
    response = env.call("PUT", path("empty-object"), consumer.token, json={})
    assert response.status_code == 201
    response = env.call("PUT", path("empty-class"), consumer.token, json={"sizeClass": "", "engine": "postgres"})
    assert response.status_code == 201


def test_put_unknown_size_class(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("PUT", path("sized"), consumer.token, json={"sizeClass": "huge"})
    assert response.status_code == 400
    assert response.json() == {"error": "unknown_size_class", "message": "unknown size class 'huge'"}
    assert env.count_databases(consumer.name) == 0


@pytest.mark.parametrize("external_id", ["Upper", "under_score", "-dash", "dash-", "a" * 64, "dot.ted", "ünï"])
def test_put_invalid_external_id(env: ApiEnv, external_id: str) -> None:
    consumer = env.ready_consumer()
    response = env.call("PUT", path(external_id), consumer.token)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_external_id"
    assert env.call("GET", path(external_id), consumer.token).json()["error"] == "invalid_external_id"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'"text"',
        b"null",
        b"42",
        b'{"sizeClass": 5}',
        b'{"sizeClass": null}',
        b'{"engine": "mysql"}',
        b'{"engine": "cloudberry"}',  # not enabled in this install
        b'{"unknown": 1}',
        b'{"sizeClass": "small", "extra": true}',
        json.dumps({"sizeClass": "x" * 64}).encode(),
        b"\xff\xfe",
    ],
)
def test_put_invalid_body(env: ApiEnv, body: bytes) -> None:
    consumer = env.ready_consumer()
    response = env.call("PUT", path("bodies"), consumer.token, data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_body"
    assert env.count_databases(consumer.name) == 0


def test_put_non_json_media_type(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("PUT", path("media"), consumer.token, data=b"sizeClass=small")  # form-encoded
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"


def test_put_body_too_large(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    big = json.dumps({"sizeClass": "small", "pad": "x" * 20000}).encode()
    response = env.call("PUT", path("big"), consumer.token, data=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"

    def chunks():
        yield b'{"sizeClass": "'
        for _ in range(40):
            yield b"x" * 1024
        yield b'"}'

    chunked = env.call("PUT", path("big"), consumer.token, data=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert env.count_databases(consumer.name) == 0


def test_put_on_deleting_database(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = answers(env, consumer, ("PUT", "doomed", 201), ("DELETE", "doomed", 202), ("PUT", "doomed", 409))
    assert response.json()["error"] == "database_deleting"
    # Also when only the phase says so (e.g. a delete request seen by the reconciler on another replica).
    answers(env, consumer, ("PUT", "phased", 201))
    env.set_status(consumer.name, "phased", {"phase": "Deleting"})
    wait_for(
        lambda: env.call("PUT", path("phased"), consumer.token).status_code == 409, what="409 for a Deleting database"
    )


def test_put_racing_an_existing_object_returns_it(env: ApiEnv) -> None:
    """AlreadyExists from the apiserver (another replica created it) gives the existing object, not 201."""
    consumer = env.ready_consumer()
    assert env.call("PUT", path("raced"), consumer.token, json={"sizeClass": "large"}).status_code == 201
    blind = blind_store(env)
    db, created = blind.ensure(consumer.name, "raced", CreateDatabase(size_class="small"))
    assert created is False
    assert db.spec.size_class == "large"
    assert env.count_databases(consumer.name) == 1


# -- quota ----------------------------------------------------------------------------------------


def test_quota_counts_databases_not_yet_deleted(env: ApiEnv) -> None:
    consumer = env.ready_consumer(max_databases=2)
    refused = answers(env, consumer, ("PUT", "q1", 201), ("PUT", "q2", 201), ("PUT", "q3", 429))
    assert refused.json()["error"] == "quota_exceeded"
    # Existing databases stay reachable with PUT (200) at the limit; a Deleting database still counts ...
    answers(env, consumer, ("PUT", "q1", 200), ("DELETE", "q1", 202))
    env.set_status(consumer.name, "q1", {"phase": "Deleting"})
    answers(env, consumer, ("PUT", "q3", 429))
    # ... a Deleted one does not.
    env.set_status(consumer.name, "q1", {"phase": "Deleted"})
    wait_for(lambda: env.call("PUT", path("q3"), consumer.token).status_code == 201, what="a slot after Deleted")
    answers(env, consumer, ("PUT", "q4", 429))
    # Raising the quota takes effect without a restart.
    env.patch_consumer(consumer.name, {"maxDatabases": 3})
    wait_for(lambda: env.call("PUT", path("q4"), consumer.token).status_code == 201, what="a raised quota")


def test_quota_counts_a_database_made_without_the_api(env: ApiEnv) -> None:
    consumer = env.ready_consumer(max_databases=2)
    answers(env, consumer, ("PUT", "via-api", 201))
    name = database_object_name(consumer.name, "by-hand")
    env.admin.create(
        DATABASES,
        {
            "apiVersion": API_VERSION,
            "kind": "Database",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"consumer": consumer.name, "externalId": "by-hand"},
        },
        NAMESPACE,
    )
    wait_for(lambda: env.components.store.databases.get(f"{NAMESPACE}/{name}") is not None, what="the cache")
    answers(env, consumer, ("PUT", "one-more", 429))


def test_a_lowered_quota_refuses_until_enough_are_deleted(env: ApiEnv) -> None:
    consumer = env.ready_consumer(max_databases=3)
    answers(env, consumer, ("PUT", "l1", 201), ("PUT", "l2", 201), ("PUT", "l3", 201))
    env.patch_consumer(consumer.name, {"maxDatabases": 1})
    wait_for(lambda: env.call("PUT", path("l4"), consumer.token).status_code == 429, what="the lowered quota")
    env.set_status(consumer.name, "l1", {"phase": "Deleted"})
    key = f"{NAMESPACE}/{database_object_name(consumer.name, 'l1')}"
    wait_for(
        lambda: (env.components.store.databases.get(key) or {}).get("status", {}).get("phase") == "Deleted",
        what="l1 Deleted in the cache",
    )
    answers(env, consumer, ("PUT", "l4", 429))  # 2 still counted, the quota is 1
    env.set_status(consumer.name, "l2", {"phase": "Deleted"})
    env.set_status(consumer.name, "l3", {"phase": "Deleted"})
    wait_for(lambda: env.call("PUT", path("l4"), consumer.token).status_code == 201, what="a slot under the quota")
    answers(env, consumer, ("PUT", "l5", 429))


def test_a_database_dropped_soon_after_its_create_frees_its_slot_at_once(env: ApiEnv) -> None:
    """The slot of a database whose object is removed (dropped) goes back as soon as the cache sees it
    gone, not only after the reservation timeout (120 s here) that covers creates still in flight."""
    consumer = env.ready_consumer(max_databases=1)

    def dropped(external_id: str) -> None:
        """What the reconciler does last after a drop: its finalizer off, the object gone."""
        name = database_object_name(consumer.name, external_id)
        env.admin.delete(DATABASES, name, NAMESPACE)
        env.admin.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
        wait_for(lambda: env.components.store.databases.get(f"{NAMESPACE}/{name}") is None, what="gone")

    answers(env, consumer, ("PUT", "brief", 201), ("PUT", "next", 429))
    dropped("brief")
    answers(env, consumer, ("PUT", "next", 201), ("PUT", "more", 429))
    # Its externalId can be created again, and then holds a slot of its own.
    dropped("next")
    answers(env, consumer, ("PUT", "brief", 201), ("PUT", "more", 429))


def test_quota_zero(env: ApiEnv) -> None:
    consumer = env.ready_consumer(max_databases=0)
    assert env.call("PUT", path("none"), consumer.token).status_code == 429


def test_quota_is_exact_under_concurrent_puts(env: ApiEnv) -> None:
    consumer = env.ready_consumer(max_databases=5)
    statuses: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def put(index: int) -> None:
        session = env.session()
        barrier.wait()
        response = env.call("PUT", path(f"burst-{index}"), consumer.token, session=session)
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(statuses) == [201] * 5 + [429] * 15
    assert env.count_databases(consumer.name) == 5
    listed = env.call("GET", "/v1/databases", consumer.token).json()["items"]
    assert len(listed) == 5


# -- GET and isolation ----------------------------------------------------------------------------


def test_get_and_list_are_isolated_between_consumers(env: ApiEnv) -> None:
    a = env.ready_consumer()
    b = env.ready_consumer()
    for external_id in ("shared", "a-only", "a-second"):
        assert env.call("PUT", path(external_id), a.token).status_code == 201
    assert env.call("PUT", path("shared"), b.token, json={"sizeClass": "large"}).status_code == 201

    a_shared = env.call("GET", path("shared"), a.token).json()
    b_shared = env.call("GET", path("shared"), b.token).json()
    assert a_shared["sizeClass"] == "" and b_shared["sizeClass"] == "large"

    # Another consumer's database is a 404 exactly like a missing one.
    foreign = env.call("GET", path("a-only"), b.token)
    missing = env.call("GET", path("never-created"), b.token)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.content == missing.content
    assert foreign.json()["error"] == "not_found"
    for method, suffix in (("GET", "/credentials"), ("POST", "/credentials/rotate"), ("DELETE", "")):
        response = env.call(method, path("a-only", suffix), b.token)
        assert response.status_code == 404, (method, suffix)
    assert "deleteRequestedAt" not in env.database(a.name, "a-only")["metadata"].get("annotations", {})

    wait_for(lambda: len(env.call("GET", "/v1/databases", a.token).json()["items"]) == 3, what="a's list")
    a_list = env.call("GET", "/v1/databases", a.token).json()["items"]
    assert [item["externalId"] for item in a_list] == ["a-only", "a-second", "shared"]
    b_list = env.call("GET", "/v1/databases", b.token).json()["items"]
    assert [item["externalId"] for item in b_list] == ["shared"]


def test_get_reports_status(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("watched"), consumer.token, json={"sizeClass": "large"}).status_code == 201
    env.set_status(
        consumer.name,
        "watched",
        {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "NoCapacity",
                    "message": "no shard",
                    "lastTransitionTime": "2026-11-30T10:00:00Z",
                }
            ],
        },
    )
    wait_for(lambda: env.call("GET", path("watched"), consumer.token).json()["phase"] == "Failed", what="Failed")
    view = env.call("GET", path("watched"), consumer.token).json()
    assert view["reason"] == "NoCapacity"
    assert view["connectionLimit"] == 50
    assert "shard" not in json.dumps(view)
    env.make_ready(consumer.name, "watched")
    view = env.call("GET", path("watched"), consumer.token).json()
    assert (view["phase"], view["reason"], view["connectionLimit"]) == ("Ready", "Provisioned", 10)


def test_get_falls_back_to_the_apiserver(env: ApiEnv) -> None:
    """An object another replica just created is found even before this replica's cache shows it."""
    consumer = env.ready_consumer()
    blind = blind_store(env)
    db, created = blind.ensure(consumer.name, "elsewhere", CreateDatabase())
    assert created
    assert blind.get(consumer.name, "elsewhere").metadata.uid == db.metadata.uid


# -- DELETE ---------------------------------------------------------------------------------------


def test_delete_sets_annotation_and_keeps_object(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("gone"), consumer.token).status_code == 201
    before = datetime.now(UTC)
    response = env.call("DELETE", path("gone"), consumer.token)
    assert response.status_code == 202
    view = response.json()
    requested = view["deleteRequestedAt"]
    assert RFC3339_MICROS.match(requested)
    assert datetime.fromisoformat(requested.replace("Z", "+00:00")) >= before.replace(microsecond=0)
    db = env.database(consumer.name, "gone")  # still there: the reconciler runs the soft delete
    assert db["metadata"]["annotations"][ANNOTATION_DELETE_REQUESTED_AT] == requested
    assert "deletionTimestamp" not in db["metadata"]
    # Idempotent: the first request time stays.
    again = env.call("DELETE", path("gone"), consumer.token)
    assert again.status_code == 202
    assert again.json()["deleteRequestedAt"] == requested
    assert env.database(consumer.name, "gone")["metadata"]["annotations"][ANNOTATION_DELETE_REQUESTED_AT] == requested


def test_delete_missing(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("DELETE", path("nothing"), consumer.token)
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_undelete_is_refused_where_the_install_does_not_allow_it(env: ApiEnv) -> None:
    assert env.config.soft_delete.allow_undelete is False  # the default install
    consumer = env.ready_consumer()
    assert env.call("PUT", path("regret"), consumer.token).status_code == 201
    requested = env.call("DELETE", path("regret"), consumer.token).json()["deleteRequestedAt"]
    for external_id in ("regret", "never-made"):  # the same answer whether the database exists or not
        response = env.call("POST", path(external_id, "/undelete"), consumer.token)
        assert response.status_code == 403
        assert response.json()["error"] == "undelete_not_allowed"
    db = env.database(consumer.name, "regret")
    assert db["metadata"]["annotations"][ANNOTATION_DELETE_REQUESTED_AT] == requested  # still being deleted
    assert env.call("PUT", path("regret"), consumer.token).json()["error"] == "database_deleting"


# -- rotation -------------------------------------------------------------------------------------


def test_rotate(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("rot"), consumer.token).status_code == 201
    early = env.call("POST", path("rot", "/credentials/rotate"), consumer.token)
    assert early.status_code == 409
    assert early.json()["error"] == "not_ready"
    env.make_ready(consumer.name, "rot")

    first = env.call("POST", path("rot", "/credentials/rotate"), consumer.token)
    assert first.status_code == 202
    value = env.database(consumer.name, "rot")["metadata"]["annotations"][ANNOTATION_ROTATE_REQUESTED_AT]
    assert RFC3339_MICROS.match(value)
    assert first.json()["rotateRequestedAt"] == value
    assert first.json()["rotationPending"] is True

    second = env.call("POST", path("rot", "/credentials/rotate"), consumer.token)
    assert second.status_code == 202
    newer = env.database(consumer.name, "rot")["metadata"]["annotations"][ANNOTATION_ROTATE_REQUESTED_AT]
    assert newer > value

    # The reconciler applied it: no longer pending.
    env.set_status(consumer.name, "rot", {"rotationApplied": newer})
    wait_for(lambda: env.call("GET", path("rot"), consumer.token).json()["rotationPending"] is False, what="rotation")

    # Being deleted: no rotation.
    assert env.call("DELETE", path("rot"), consumer.token).status_code == 202
    assert env.call("POST", path("rot", "/credentials/rotate"), consumer.token).status_code == 409


def test_rotate_can_ask_to_end_the_old_sessions(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("rot-end"), consumer.token).status_code == 201
    env.make_ready(consumer.name, "rot-end")

    asked = env.call("POST", path("rot-end", "/credentials/rotate"), consumer.token, json={"terminateSessions": True})
    assert asked.status_code == 202
    notes = env.database(consumer.name, "rot-end")["metadata"]["annotations"]
    requested = asked.json()["rotateRequestedAt"]
    assert notes[ANNOTATION_ROTATE_END_SESSIONS] == notes[ANNOTATION_ROTATE_REQUESTED_AT] == requested

    # A later rotation without the option leaves sessions alone: the flag goes with its request.
    plain = env.call("POST", path("rot-end", "/credentials/rotate"), consumer.token, json={"terminateSessions": False})
    assert plain.status_code == 202
    notes = env.database(consumer.name, "rot-end")["metadata"]["annotations"]
    assert ANNOTATION_ROTATE_END_SESSIONS not in notes
    assert env.call("POST", path("rot-end", "/credentials/rotate"), consumer.token).status_code == 202  # no body


@pytest.mark.parametrize(
    ("body", "content_type", "status", "error"),
    [
        (b'{"terminateSessions": "yes"}', "application/json", 400, "invalid_body"),
        (b'{"terminate": true}', "application/json", 400, "invalid_body"),
        (b"[true]", "application/json", 400, "invalid_body"),
        (b"{not json", "application/json", 400, "invalid_body"),
        (b'{"terminateSessions": true}', "text/plain", 415, "unsupported_media_type"),
        (b'{"overlapSeconds": -1}', "application/json", 400, "invalid_body"),
        (b'{"overlapSeconds": 86401}', "application/json", 400, "invalid_body"),
        (b'{"overlapSeconds": 1.5}', "application/json", 400, "invalid_body"),
        (b'{"overlapSeconds": "600"}', "application/json", 400, "invalid_body"),
        (b'{"overlapSeconds": true}', "application/json", 400, "invalid_body"),
        (b'{"overlapSeconds": 600, "terminateSessions": true}', "application/json", 400, "invalid_body"),
    ],
)
def test_rotate_refuses_bad_bodies_and_records_nothing(
    env: ApiEnv, body: bytes, content_type: str, status: int, error: str
) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("rot-bad"), consumer.token).status_code == 201
    env.make_ready(consumer.name, "rot-bad")

    headers = {"Content-Type": content_type}
    response = env.call("POST", path("rot-bad", "/credentials/rotate"), consumer.token, data=body, headers=headers)

    assert (response.status_code, response.json()["error"]) == (status, error)
    notes = env.database(consumer.name, "rot-bad")["metadata"].get("annotations") or {}
    assert ANNOTATION_ROTATE_REQUESTED_AT not in notes


def test_rotate_with_an_overlap_records_it_with_its_request(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", path("rot-overlap"), consumer.token).status_code == 201
    env.make_ready(consumer.name, "rot-overlap")

    asked = env.call("POST", path("rot-overlap", "/credentials/rotate"), consumer.token, json={"overlapSeconds": 600})
    assert asked.status_code == 202, asked.text
    notes = env.database(consumer.name, "rot-overlap")["metadata"]["annotations"]
    assert notes[ANNOTATION_ROTATE_OVERLAP] == "600"

    # The overlap goes with its request: a later one without it (the install's default is 0) has none.
    assert env.call("POST", path("rot-overlap", "/credentials/rotate"), consumer.token).status_code == 202
    assert ANNOTATION_ROTATE_OVERLAP not in env.database(consumer.name, "rot-overlap")["metadata"]["annotations"]


def test_rotate_missing(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("POST", path("nope", "/credentials/rotate"), consumer.token).status_code == 404


def test_method_not_allowed(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    response = env.call("PATCH", path("x"), consumer.token)
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
    assert "PUT" in response.headers["Allow"]
