"""While the Kubernetes API is unreachable the consumer API says so promptly: /readyz is 503 (the
replica leaves the Service) and writes answer 503 `unavailable` at once, or within the short
request timeout when the apiserver hangs, instead of after a minute; reads keep serving the cache."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from api.store import DatabaseStore
from informers import Rest
from tests.api.support import ApiEnv


@pytest.fixture
def store(env: ApiEnv) -> Iterator[DatabaseStore]:
    store = env.components.store
    saved = (store.reachable, store.rest, store.write_timeout)
    yield store
    store.reachable, store.rest, store.write_timeout = saved


@pytest.fixture
def silent_apiserver() -> Iterator[str]:
    """A TCP listener that accepts connections and never answers (a paused kube-apiserver)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_lost_contact_makes_readyz_503_and_writes_503_at_once(env: ApiEnv, store: DatabaseStore) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", "/v1/databases/kept", consumer.token).status_code == 201
    store.reachable = lambda: False
    assert env.call("GET", "/readyz").status_code == 503
    for method, path in (
        ("PUT", "/v1/databases/new-one"),
        ("DELETE", "/v1/databases/kept"),
        ("POST", "/v1/databases/kept/credentials/rotate"),
    ):
        started = time.monotonic()
        response = env.call(method, path, consumer.token)
        assert response.status_code == 503, (method, response.text)
        assert response.json()["error"] == "unavailable"
        assert time.monotonic() - started < 2.0
    assert env.call("GET", "/v1/databases/kept", consumer.token).status_code == 200  # reads: from the cache
    store.reachable = lambda: True
    assert env.call("GET", "/readyz").status_code == 200
    assert env.call("PUT", "/v1/databases/new-one", consumer.token).status_code == 201


def test_a_hung_apiserver_costs_a_write_the_request_timeout_not_a_minute(
    env: ApiEnv, store: DatabaseStore, silent_apiserver: str
) -> None:
    consumer = env.ready_consumer()
    configuration = env.informers.rest.api_client.configuration
    hung = type(configuration)()
    hung.host, hung.verify_ssl = silent_apiserver, False
    client = ApiClient(hung)
    try:
        store.rest = Rest(client)
        store.write_timeout = (1.0, 1.0)
        started = time.monotonic()
        response = env.call("PUT", "/v1/databases/hangs", consumer.token)
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert response.status_code == 503 and response.json()["error"] == "unavailable"
    assert elapsed < 5.0, f"the PUT took {elapsed:.1f}s"
