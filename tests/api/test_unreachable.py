"""While the Kubernetes API is unreachable the consumer API says so promptly: /readyz is 503 (the
replica leaves the Service) and writes answer 503 `unavailable` at once, or within the short
request timeout when the apiserver hangs, instead of after a minute; reads keep serving the cache."""

from __future__ import annotations

import copy
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from api.errors import KUBE_API_SLOW, KUBE_API_UNREACHABLE
from api.store import REQUEST_BUDGET, DatabaseStore
from harness.sockets import accepted
from informers import Rest
from tests.api.support import ApiEnv


@pytest.fixture
def store(env: ApiEnv) -> Iterator[DatabaseStore]:
    store = env.components.store
    saved = (store.reachable, store.rest, store.request_budget)
    yield store
    store.reachable, store.rest, store.request_budget = saved


@pytest.fixture
def silent_apiserver() -> Iterator[str]:
    """A TCP listener that accepts connections and never answers (a paused kube-apiserver)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        for conn in accepted(listener, stop):
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
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


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/databases/hangs"),
        ("DELETE", "/v1/databases/kept"),
        ("POST", "/v1/databases/kept/credentials/rotate"),
    ],
)
def test_a_silent_apiserver_costs_a_write_at_most_a_second(
    env: ApiEnv, store: DatabaseStore, silent_apiserver: str, method: str, path: str
) -> None:
    """In the first seconds of an outage (before the replica knows it lost contact), every write is
    bounded by the request budget (1 s for all its apiserver requests, none retried behind its back):
    503 within a second, no DELETE that hangs past a client's timeout."""
    consumer = env.ready_consumer()
    assert env.call("PUT", "/v1/databases/kept", consumer.token).status_code in (200, 201)
    store.request_budget = REQUEST_BUDGET  # the production bound
    configuration = copy.deepcopy(env.informers.rest.api_client.configuration)
    configuration.host = silent_apiserver
    client = ApiClient(configuration)
    try:
        store.rest = Rest(client).without_retries()
        started = time.monotonic()
        response = env.call(method, path, consumer.token)
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert response.status_code == 503 and response.json()["error"] == "unavailable", response.text
    assert response.json()["message"] == KUBE_API_SLOW  # silent is not gone: it says so
    assert elapsed < REQUEST_BUDGET + 0.5, f"the {method} took {elapsed:.1f}s"


def test_a_refused_connection_is_unreachable_not_slow(env: ApiEnv, store: DatabaseStore) -> None:
    """A port nobody listens on answers at once: the write is 503 'unreachable' (urllib3 makes a refused
    connection a kind of connect timeout; the message does not take it for a slow apiserver)."""
    consumer = env.ready_consumer()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    configuration = copy.deepcopy(env.informers.rest.api_client.configuration)
    configuration.host = f"https://127.0.0.1:{port}"
    client = ApiClient(configuration)
    try:
        store.rest = Rest(client).without_retries()
        response = env.call("PUT", "/v1/databases/refused", consumer.token)
    finally:
        client.close()
    assert response.status_code == 503 and response.json()["error"] == "unavailable", response.text
    assert response.json()["message"] == KUBE_API_UNREACHABLE
