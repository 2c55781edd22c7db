"""Learning what changed: the list's ETag with If-None-Match, and each database's credentialsVersion.

A client polling many databases sends one conditional list request (304 while nothing changed) and
fetches credentials only when a database's credentialsVersion moved. The tag is derived from shared
state: a second API replica, with caches of its own, gives the same tag.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from kubernetes.client import ApiClient

from api import build_api
from informers import Rest, SharedInformers
from tests.api.support import ApiEnv, Consumer, Served
from tests.support.common import wait_for

LIST = "/v1/databases"


def listed(env: ApiEnv, consumer: Consumer, etag: str | None = None) -> tuple[int, str, dict | None]:
    headers = {"If-None-Match": etag} if etag else None
    response = env.call("GET", LIST, consumer.token, headers=headers)
    body = response.json() if response.status_code == 200 else None
    if response.status_code == 304:
        assert response.content == b""
    return response.status_code, response.headers["ETag"], body


def version_of(env: ApiEnv, consumer: Consumer, external_id: str) -> str | None:
    _, _, body = listed(env, consumer)
    assert body is not None
    (db,) = [item for item in body["items"] if item["externalId"] == external_id]
    return db["credentialsVersion"]


def test_unchanged_list_answers_304_and_any_change_a_new_tag(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    status, empty_tag, body = listed(env, consumer)
    assert status == 200 and body == {"items": []}
    assert empty_tag.startswith('"') and empty_tag.endswith('"')
    assert listed(env, consumer, empty_tag)[:2] == (304, empty_tag)
    assert env.call("GET", LIST, consumer.token, headers={"If-None-Match": '"other", ' + empty_tag}).status_code == 304
    assert env.call("GET", LIST, consumer.token, headers={"If-None-Match": '"other"'}).status_code == 200

    assert env.call("PUT", "/v1/databases/orders", consumer.token).status_code == 201
    status, created_tag, body = listed(env, consumer, empty_tag)
    assert status == 200 and created_tag != empty_tag
    assert body is not None and [db["externalId"] for db in body["items"]] == ["orders"]

    env.make_ready(consumer.name, "orders")
    status, ready_tag, body = listed(env, consumer, created_tag)
    assert status == 200 and ready_tag != created_tag
    assert body is not None and body["items"][0]["phase"] == "Ready"
    assert listed(env, consumer, ready_tag)[0] == 304

    # Another consumer's lists are its own: the first consumer's tag does not move.
    other = env.ready_consumer()
    assert env.call("PUT", "/v1/databases/orders", other.token).status_code == 201
    assert listed(env, consumer, ready_tag)[0] == 304


def test_credentials_version_moves_with_the_credentials_only(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", "/v1/databases/app", consumer.token).status_code == 201
    assert version_of(env, consumer, "app") is None  # not Ready: nothing handed out
    db = env.make_ready(consumer.name, "app")
    assert version_of(env, consumer, "app") is None  # Ready, but no Secret yet

    values = env.credentials_secret(db, password_id="1111111111111111")
    env.set_status(consumer.name, "app", {"passwordApplied": "1111111111111111"})
    wait_for(lambda: version_of(env, consumer, "app") is not None, what="a credentials version")
    first = version_of(env, consumer, "app")
    assert first is not None and values["password"] not in first
    single = env.call("GET", "/v1/databases/app", consumer.token).json()
    assert single["credentialsVersion"] == first

    # A change that is not the credentials' leaves the version alone.
    env.set_status(consumer.name, "app", {"appliedConnectionLimit": 7})
    wait_for(lambda: env.call("GET", "/v1/databases/app", consumer.token).json()["connectionLimit"] == 7, what="limit")
    assert version_of(env, consumer, "app") == first

    # A rotation: the new password is pending (still the old version) until it is in effect.
    rotated = env.credentials_secret(
        db, password_id="2222222222222222", values={"host": values["host"], "password": "new-password-value-x"}
    )
    assert version_of(env, consumer, "app") == first
    env.set_status(consumer.name, "app", {"passwordApplied": "2222222222222222"})
    wait_for(lambda: version_of(env, consumer, "app") not in (None, first), what="the rotated version")
    second = version_of(env, consumer, "app")
    assert env.call("GET", "/v1/databases/app/credentials", consumer.token).json()["password"] == rotated["password"]

    # The shard's client endpoint changes: a new version too.
    env.credentials_secret(db, password_id="2222222222222222", values={**rotated, "host": "pg2.shard01.example"})
    wait_for(lambda: version_of(env, consumer, "app") not in (None, first, second), what="the endpoint version")


@pytest.fixture
def second_replica(env: ApiEnv) -> Iterator[str]:
    """Another API replica: informers of its own on the same apiserver, served on another port."""
    client = ApiClient(env.admin.api_client.configuration)
    informers = SharedInformers(Rest(client))
    components = build_api(env.config, informers)
    informers.start()
    try:
        assert informers.wait_for_sync(60)
        with Served(components.app, env) as base:
            yield base
    finally:
        informers.stop()
        client.close()


def test_every_replica_gives_the_same_tag(env: ApiEnv, second_replica: str) -> None:
    consumer = env.ready_consumer()
    for external_id in ("a", "b"):
        assert env.call("PUT", f"/v1/databases/{external_id}", consumer.token).status_code == 201
    db = env.make_ready(consumer.name, "a")
    env.credentials_secret(db)
    _, tag, body = listed(env, consumer)
    headers = {"Authorization": f"Bearer {consumer.token}"}

    def replica_tag() -> str | None:
        response = requests.get(second_replica + LIST, headers=headers, timeout=30, verify=str(env.ca_file))
        return response.headers.get("ETag") if response.status_code == 200 else None

    wait_for(lambda: replica_tag() == tag, what="the second replica's tag")
    answer = requests.get(
        second_replica + LIST, headers={**headers, "If-None-Match": tag}, timeout=30, verify=str(env.ca_file)
    )
    assert answer.status_code == 304
