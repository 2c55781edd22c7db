"""The API's front door under hostile clients, over real TLS sockets on loopback.

Each attack is bounded (a few dozen connections, stopped when the test's legitimate requests are
done, and by itself after two minutes at most). The attackers connect from 127.0.0.2-127.0.0.9, the
legitimate client from 127.0.0.1, so the per-address cap is exercised only where a test means it.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry
from requests.adapters import HTTPAdapter

from harness.attacks import HostileClients
from tests.api.support import ApiEnv, Consumer, Served, new_token, sha256_hex
from tests.support.common import wait_for

REPO = Path(__file__).resolve().parents[2]
ATTACK_SOURCES = tuple(f"127.0.0.{n}" for n in range(2, 10))
PROBE_TIMEOUT = 3  # a kubelet probe's timeout


@pytest.fixture(scope="module")
def consumer(env: ApiEnv) -> Consumer:
    return env.ready_consumer()


@pytest.fixture
def hardened(env: ApiEnv) -> Iterator[str]:
    """The real API on a second server with short deadlines, so that their effect shows in seconds."""
    with Served(env.components.app, env, header_timeout=2, body_timeout=2, idle_timeout=2) as base:
        yield base


def legit_round(env: ApiEnv, base: str, consumer: Consumer) -> list[int]:
    """What a probe and a consumer do: a new TLS connection per request, a probe's timeout."""
    statuses = []
    for path, token in (("/healthz", None), ("/readyz", None), ("/v1/databases", consumer.token)):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = requests.get(base + path, headers=headers, verify=str(env.ca_file), timeout=PROBE_TIMEOUT)
        statuses.append(response.status_code)
    return statuses


class SourceAddressAdapter(HTTPAdapter):
    """requests from a given loopback source address."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def answers(base: str, env: ApiEnv) -> bool:
    try:
        return requests.get(base + "/healthz", verify=str(env.ca_file), timeout=5).status_code == 200
    except requests.exceptions.ConnectionError:
        return False


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    ("kind", "count"),
    [("silent", 8), ("slow", 16), ("idle", 20)],
    ids=["silent TCP sockets", "slow-header TLS connections", "idle TLS connections"],
)
def test_attack_does_not_stop_legitimate_requests(
    env: ApiEnv, consumer: Consumer, hardened: str, kind: str, count: int
) -> None:
    """Every legitimate request succeeds meanwhile, and the deadline drops each attacking connection."""
    with HostileClients(port_of(hardened), **{kind: count}, sources=ATTACK_SOURCES, byte_every=0.5) as attack:
        wait_for(lambda: attack.opened >= count, timeout=30, what="the attack connections")
        statuses: list[int] = []
        give_up = time.monotonic() + 60  # the deadlines are 2 s: a minute means they never fired
        while attack.dropped < count:  # until the server has dropped as many as were open
            statuses += legit_round(env, hardened, consumer)
            assert time.monotonic() < give_up, "the deadline never dropped the attackers"
    assert statuses and set(statuses) == {200}


def test_all_attacks_at_once_against_the_served_api(env: ApiEnv, consumer: Consumer) -> None:
    """The issue's attack on the API as started for the suite (default deadlines): probes stay answered."""
    port = env.server.port
    assert port is not None
    with HostileClients(port, silent=8, slow=16, idle=20, sources=ATTACK_SOURCES) as attack:
        wait_for(lambda: attack.opened >= 44, timeout=30, what="the attack connections")
        statuses = [status for _ in range(10) for status in legit_round(env, env.base_url, consumer)]
    assert statuses == [200] * 30


def test_idle_keep_alive_connection_is_closed(env: ApiEnv, hardened: str) -> None:
    with tls_connection(env, port_of(hardened)) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
        first = tls.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        assert b"connection: close" not in first.lower()  # kept alive...
        assert read_to_eof(tls) == b""  # ...until idle for idleTimeout


def test_slow_body_is_dropped(env: ApiEnv, hardened: str) -> None:
    with tls_connection(env, port_of(hardened)) as tls:
        tls.sendall(b"PUT /v1/databases/slow HTTP/1.1\r\nHost: api\r\nContent-Length: 10\r\n\r\n12345")
        assert read_to_eof(tls) == b""  # no answer: closed at the body deadline


def client_hello() -> tuple[bytes, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """The first flight of a TLS client, made without a socket (to tell a parked connection apart)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="api")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read(), tls, incoming, outgoing


def test_unauthenticated_connections_over_the_address_bound_wait_their_turn(
    env: ApiEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """Over maxConnectionsPerClient a connection is parked (nothing read, no reset) and started as soon
    as one of its address' connections closes; other addresses are served meanwhile."""
    registry = CollectorRegistry()
    with Served(env.components.app, env, max_connections_per_client=4, registry=registry) as base:
        port = port_of(base)
        held = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(4)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1, source_address=("127.0.0.2", 0)) as extra:
                hello, *_ = client_hello()
                extra.sendall(hello)
                with pytest.raises(TimeoutError):
                    extra.recv(1)  # parked: its ClientHello is not answered...
                assert answers(base, env)  # ...while another address is served
                held.pop().close()
                extra.settimeout(10)
                assert extra.recv(1) == b"\x16"  # ...and the freed place goes to it: a TLS handshake record
        finally:
            for sock in held:
                sock.close()
    per_client = {"limit": "maxConnectionsPerClient"}
    assert registry.get_sample_value("dbprovider_api_connections_refused_total", per_client) == 0


def test_parked_connection_is_dropped_after_the_header_deadline(env: ApiEnv) -> None:
    registry = CollectorRegistry()
    options = {"max_connections_per_client": 1, "header_timeout": 1, "idle_timeout": 30}
    with Served(env.components.app, env, registry=registry, **options) as base:
        port = port_of(base)
        # The address' one place is held by an idle keep-alive connection (30 s), not by one in its
        # handshake: that one's own header deadline would end first and give its place to the parked one.
        context = ssl.create_default_context(cafile=str(env.ca_file))
        holder = http.client.HTTPSConnection("127.0.0.1", port, context=context, source_address=("127.0.0.2", 0))
        try:
            holder.request("GET", "/healthz")
            answer = holder.getresponse()
            answer.read()
            assert answer.status == 200
            with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)) as extra:
                assert extra.recv(1) == b""
        finally:
            holder.close()
    assert registry.get_sample_value("dbprovider_api_connections_dropped_total", {"reason": "parkedTimeout"}) >= 1


def test_a_client_streaming_chunks_after_its_refusal_is_held_and_cannot_reconnect_at_once(
    env: ApiEnv, consumer: Consumer
) -> None:
    """The chunk attack: 8 clients send 1-byte chunks as fast as they can; the server refuses
    each body at its chunk bound (413), and they reconnect the moment their connection ends. Each refused
    connection whose client goes on sending is held, reading nothing, for the header deadline, then
    dropped and counted: an attacker gets one TLS handshake per deadline out of the server, not one per
    refusal (hundreds a second before), and every legitimate request succeeds meanwhile."""
    registry = CollectorRegistry()
    attackers, deadline = 8, 2
    held = {"reason": "sendingAfterRefusal"}
    with Served(env.components.app, env, header_timeout=deadline, registry=registry) as base:
        started = time.monotonic()
        with HostileClients(port_of(base), chunks=attackers, sources=ATTACK_SOURCES) as attack:
            statuses: list[int] = []
            give_up = started + 60
            while (
                registry.get_sample_value("dbprovider_api_connections_dropped_total", held) or 0
            ) < 2 * attackers or time.monotonic() < started + 3 * deadline:
                statuses += legit_round(env, base, consumer)
                assert time.monotonic() < give_up, "refused attackers were never held and dropped"
        elapsed = time.monotonic() - started
        opened = attack.opened
    refused = registry.get_sample_value("dbprovider_api_requests_refused_total", {"reason": "tooManyChunks"})
    assert statuses and set(statuses) == {200}
    assert refused is not None and refused >= 2 * attackers
    # Each attacker's connection lasts at least the deadline, so it opens at most one per deadline.
    assert opened <= attackers * (elapsed / deadline + 2), f"{opened} connections in {elapsed:.1f} s"


def test_a_dripped_chunked_body_is_dropped_at_the_body_deadline(env: ApiEnv, consumer: Consumer) -> None:
    """A chunked body dripped one tiny chunk at a time, never finished: the connection is dropped without
    an answer at the body deadline and counted, and every legitimate request succeeds meanwhile."""
    registry = CollectorRegistry()
    ended = threading.Event()
    with Served(env.components.app, env, body_timeout=2, registry=registry) as base:
        with tls_connection(env, port_of(base), source="127.0.0.2") as tls:
            tls.sendall(b"PUT /v1/databases/drip HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n")

            def drip() -> None:
                try:
                    while not ended.wait(0.2):
                        tls.sendall(b"1\r\nx\r\n")
                except OSError:
                    ended.set()

            dripper = threading.Thread(target=drip, daemon=True)
            dripper.start()
            statuses: list[int] = []
            give_up = time.monotonic() + 30
            while not ended.is_set():
                statuses += legit_round(env, base, consumer)
                assert time.monotonic() < give_up, "the dripping connection was never dropped"
            dripper.join(5)
            answer = read_to_eof(tls)
    assert answer == b""  # dropped, not answered
    assert registry.get_sample_value("dbprovider_api_connections_dropped_total", {"reason": "bodyTimeout"}) == 1
    assert statuses and set(statuses) == {200}


def test_a_burst_from_one_address_is_served_without_resets(env: ApiEnv, consumer: Consumer) -> None:
    """What a consumer cluster behind one egress address does (bench.provisioning): many requests at once,
    each on a new connection, over the per-address bound; every one is answered."""
    with Served(env.components.app, env, max_connections_per_client=4) as base:
        statuses: list[int | str] = []

        def call(n: int) -> None:
            try:
                session = requests.Session()
                session.mount("https://", SourceAddressAdapter("127.0.0.2"))
                response = session.get(
                    base + "/v1/databases",
                    headers={"Authorization": f"Bearer {consumer.token}"},
                    verify=str(env.ca_file),
                    timeout=30,
                )
                statuses.append(response.status_code)
            except requests.RequestException as exc:
                statuses.append(type(exc).__name__)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert sorted(statuses, key=str) == [200] * 40


def test_authenticated_connections_leave_the_address_bound(env: ApiEnv, consumer: Consumer) -> None:
    with Served(env.components.app, env, max_connections_per_client=2) as base:
        port = port_of(base)
        auth = f"Authorization: Bearer {consumer.token}\r\n".encode()
        kept = [tls_connection(env, port, source="127.0.0.2") for _ in range(2)]
        try:
            for connection in kept:
                connection.tls.sendall(b"GET /v1/databases HTTP/1.1\r\nHost: api\r\n" + auth + b"\r\n")
                assert connection.tls.recv(65536).startswith(b"HTTP/1.1 200")  # kept alive, authenticated
            # The address' two unauthenticated places are free again: a third connection is served at once.
            with tls_connection(env, port, source="127.0.0.2") as third:
                third.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
                assert read_to_eof(third).startswith(b"HTTP/1.1 200")
        finally:
            for connection in kept:
                connection.tls.close()


def slow_app(app: Any, seconds: float) -> Any:
    """The real app, holding its worker (and the consumer's place) `seconds` longer on `?slow`."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        result = list(app(environ, start_response))
        if "slow" in environ.get("QUERY_STRING", ""):
            time.sleep(seconds)
        return result

    return wrapped


def bearer_get(base: str, env: ApiEnv, token: str, query: str = "") -> requests.Response:
    return requests.get(
        base + "/v1/databases" + query,
        headers={"Authorization": f"Bearer {token}"},
        verify=str(env.ca_file),
        timeout=30,
    )


def test_a_consumers_burst_waits_in_its_own_lane(env: ApiEnv, consumer: Consumer) -> None:
    """2 worker threads, 1 request of a consumer in the app at a time: 6 slow requests of one consumer
    are all answered 200 (queued in their lane, not refused), and another consumer from the same address
    is answered at once, not after the 4 queued ones (3 s in one line)."""
    other = env.ready_consumer()
    with Served(slow_app(env.components.app, 1.5), env, threads=2, max_requests_per_consumer=1) as base:
        burst: list[int] = []
        threads = [
            threading.Thread(target=lambda: burst.append(bearer_get(base, env, consumer.token, "?slow").status_code))
            for _ in range(6)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # the burst is in the app and in its lane
        started = time.monotonic()
        assert bearer_get(base, env, other.token).status_code == 200
        assert time.monotonic() - started < 1.8
        for thread in threads:
            thread.join(30)
    assert burst == [200] * 6


def test_a_consumer_over_its_concurrency_bound_gets_429_with_retry_after(env: ApiEnv) -> None:
    """The bound holds per consumer across its credentials: two tokens of one consumer (a rotation)."""
    first, second = new_token(), new_token()
    env.remember(first, second, sha256_hex(first), sha256_hex(second))
    env.new_consumer(hash_lines=[sha256_hex(first), sha256_hex(second)])
    env.wait_status("GET", "/v1/databases", second, 200)
    registry = CollectorRegistry()
    with Served(slow_app(env.components.app, 3), env, max_requests_per_consumer=2, registry=registry) as base:
        slow: list[int] = []
        threads = [
            threading.Thread(target=lambda: slow.append(bearer_get(base, env, first, "?slow").status_code))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)  # both are in the app, holding the consumer's two places
        third = bearer_get(base, env, second)
        assert third.status_code == 429
        assert third.headers["Retry-After"] == "1"
        assert third.json()["error"] == "too_many_requests"
        for thread in threads:
            thread.join(30)
        assert slow == [200, 200]
        assert bearer_get(base, env, second).status_code == 200  # its places are back
    assert registry.get_sample_value("dbprovider_api_requests_refused_total", {"reason": "consumerConcurrency"}) == 1


def test_a_full_server_makes_room_for_a_new_client(env: ApiEnv, caplog: pytest.LogCaptureFixture) -> None:
    """At maxConnections a new connection takes the place of the waiting client with the most connections."""
    registry = CollectorRegistry()
    with Served(env.components.app, env, max_connections=3, registry=registry) as base:
        port = port_of(base)
        held = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(2)]
        held.append(socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0)))
        try:
            wait_for(lambda: registry.get_sample_value("dbprovider_api_connections_open") == 3, what="3 open")
            assert answers(base, env)
            held[0].settimeout(10)
            assert held[0].recv(1) == b""  # the oldest of 127.0.0.2, the address with the most, made room
            held[2].setblocking(False)
            with pytest.raises(BlockingIOError):
                held[2].recv(1)  # 127.0.0.3's one connection is still open
        finally:
            for sock in held:
                sock.close()
    assert registry.get_sample_value("dbprovider_api_connections_refused_total", {"limit": "evicted"}) >= 1
    assert any("evicted" in r.getMessage() or "make room" in r.getMessage() for r in caplog.records)


def test_a_full_server_of_busy_connections_refuses_at_once(env: ApiEnv, consumer: Consumer) -> None:
    registry = CollectorRegistry()
    app = slow_app(env.components.app, 3)
    with Served(app, env, max_connections=2, registry=registry) as base:
        port = port_of(base)
        auth = f"Authorization: Bearer {consumer.token}\r\n".encode()
        busy = [tls_connection(env, port) for _ in range(2)]
        try:
            for connection in busy:
                connection.tls.sendall(b"GET /v1/databases?slow HTTP/1.1\r\nHost: api\r\n" + auth + b"\r\n")
            wait_for(lambda: registry.get_sample_value("dbprovider_api_connections_open") == 2, what="2 open")
            time.sleep(0.5)  # both requests are in the app now
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                assert extra.recv(1) == b""  # nothing to make room with: closed at once
            for connection in busy:
                assert connection.tls.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            for connection in busy:
                connection.tls.close()
    assert registry.get_sample_value("dbprovider_api_connections_refused_total", {"limit": "maxConnections"}) == 1


def test_legitimate_requests_succeed_while_attackers_fill_the_server(env: ApiEnv, consumer: Consumer) -> None:
    """maxConnections reached by idle TLS attackers from 8 addresses: every legitimate request succeeds."""
    with Served(env.components.app, env, max_connections=12) as base:
        with HostileClients(port_of(base), idle=24, sources=ATTACK_SOURCES) as attack:
            wait_for(lambda: attack.opened >= 24, timeout=30, what="the attack connections")
            statuses = [status for _ in range(10) for status in legit_round(env, base, consumer)]
    assert statuses == [200] * 30


def test_legitimate_requests_succeed_when_file_descriptors_run_out(env: ApiEnv) -> None:
    """A server with 24 descriptors to spare, 48 idle TLS attackers: accept() fails with EMFILE, the
    server frees a descriptor by closing the heaviest client's oldest waiting connection, and every
    legitimate request succeeds; the accept errors are logged with their errno, rate-limited."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.api.fd_limited_server", str(env.cert_file), str(env.key_file), "24"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        base = f"https://127.0.0.1:{port}"
        with HostileClients(port, idle=48, sources=ATTACK_SOURCES) as attack:
            wait_for(lambda: attack.opened >= 60, timeout=30, what="the attackers to run into the limit")
            statuses = []
            for _ in range(20):
                response = requests.get(base + "/healthz", verify=str(env.ca_file), timeout=PROBE_TIMEOUT)
                statuses.append(response.status_code)
    finally:
        _, errors = server.communicate("", timeout=30)
    assert statuses == [200] * 20
    accept_errors = [line for line in errors.splitlines() if "accept failed" in line]
    assert accept_errors and "EMFILE" in accept_errors[0]
    assert len(accept_errors) <= 3  # the first at once, then one every 10 s with a count


# -- probes and deadlines -------------------------------------------------------------------------


def test_probes_never_wait_behind_app_requests(env: ApiEnv, consumer: Consumer) -> None:
    """Every worker thread busy with a slow request (a slow apiserver): /healthz and /readyz still
    answer within a kubelet probe's timeout, so the pod is not restarted for being loaded."""
    with Served(slow_app(env.components.app, 4), env, threads=2) as base:
        slow = [threading.Thread(target=bearer_get, args=(base, env, consumer.token, "?slow")) for _ in range(6)]
        for thread in slow:
            thread.start()
        time.sleep(0.5)
        for _ in range(3):
            for path in ("/healthz", "/readyz"):
                started = time.monotonic()
                assert requests.get(base + path, verify=str(env.ca_file), timeout=PROBE_TIMEOUT).status_code == 200
                assert time.monotonic() - started < 1.5
        for thread in slow:
            thread.join(30)


def test_a_stuck_handler_answers_503_at_the_request_deadline(
    env: ApiEnv, consumer: Consumer, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    with Served(slow_app(env.components.app, 4), env, request_timeout=1, registry=registry) as base:
        started = time.monotonic()
        response = bearer_get(base, env, consumer.token, "?slow")
        assert time.monotonic() - started < 3
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert response.json()["error"] == "unavailable"
        assert bearer_get(base, env, consumer.token).status_code == 200  # the next request is served
    assert registry.get_sample_value("dbprovider_api_requests_refused_total", {"reason": "requestTimeout"}) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "api.server" and r.levelno == logging.WARNING]
    assert any("answered 503" in m and "127.0.0.1" in m for m in warnings)


def broken_app(kind: str) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if kind == "status":
            start_response("abc", [("Content-Type", "application/json")])
        elif kind == "header":
            start_response("200 OK", [("X-Name", "caf\u00e9\u2603")])
        else:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return ["not bytes"]
        return [b"{}"]

    return app


@pytest.mark.parametrize("kind", ["status", "header", "body"])
def test_an_answer_the_app_cannot_give_becomes_500_with_a_json_body(env: ApiEnv, kind: str) -> None:
    with Served(broken_app(kind), env) as base:
        response = requests.get(base + "/anything", verify=str(env.ca_file), timeout=10)
    assert response.status_code == 500
    assert response.json() == {"error": "internal_error", "message": "internal error"}


# -- framing ----------------------------------------------------------------------------------------

NEXT = b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n"  # must never be answered after a refused request
FRAMING_CASES = {
    "TE on HTTP/1.0": b"POST /healthz HTTP/1.0\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    + b"%x\r\n" % len(NEXT)
    + NEXT
    + b"\r\n0\r\n\r\n",
    "CL with TE": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\n",
    "duplicate CL": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    "different CL": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
    "CL 1_0": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: 1_0\r\n\r\n0123456789",
    "CL +2": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: +2\r\n\r\nxx",
    "CL list": b"POST /healthz HTTP/1.1\r\nHost: api\r\nContent-Length: 1, 1\r\n\r\nx",
    "TE not chunked": b"POST /healthz HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-A: 1\r\n 2\r\n\r\n",
    "space before colon": b"GET /healthz HTTP/1.1\r\nHost: api\r\nContent-Length : 0\r\n\r\n",
    "bare LF": b"GET /healthz HTTP/1.1\nHost: api\r\n\r\n",
    "no Host on 1.1": b"GET /healthz HTTP/1.1\r\nX-A: 1\r\n\r\n",
    "two Hosts on 1.0": b"GET /healthz HTTP/1.0\r\nHost: a\r\nHost: b\r\nConnection: keep-alive\r\n\r\n",
    "trailer ended by a bare LF": b"POST /healthz HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n",
    "junk trailer": b"POST /healthz HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n0\r\njunk\r\n\r\n",
    "bad chunk size": b"POST /healthz HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0x2\r\nab\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("payload", FRAMING_CASES.values(), ids=FRAMING_CASES.keys())
def test_ambiguous_framing_gets_400_and_a_closed_connection(env: ApiEnv, payload: bytes) -> None:
    with tls_connection(env, env.server.port) as tls:
        tls.sendall(payload + NEXT)
        answer = read_to_eof(tls)
    assert status_lines(answer) == [b"HTTP/1.1 400 Bad Request"]
    assert b"connection: close" in answer.lower()
    assert answer.endswith(b"}")  # a JSON error body, then the server closed


def test_oversized_header_block_gets_431_and_a_closed_connection(env: ApiEnv) -> None:
    with tls_connection(env, env.server.port) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n")
        answer = read_to_eof(tls)
    assert status_lines(answer) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    # The front door's own refusal says what Falcon's 431 says (api.errors.FALCON_ERRORS).
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "headers_too_large"


def test_unread_body_closes_the_connection(env: ApiEnv) -> None:
    """A GET with a body the app does not read: answered, then closed; the body is never a request."""
    smuggled = b"GET /v1/databases HTTP/1.1\r\nHost: api\r\n\r\n"
    chunked = b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"
    with tls_connection(env, env.server.port) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + NEXT)
        answer = read_to_eof(tls)
    assert status_lines(answer) == [b"HTTP/1.1 200 OK"]
    assert b"connection: close" in answer.lower()


def test_keep_alive_and_pipelining_still_work(env: ApiEnv, consumer: Consumer) -> None:
    auth = f"Authorization: Bearer {consumer.token}\r\n".encode()
    with tls_connection(env, env.server.port) as tls:
        tls.sendall(NEXT + b"GET /v1/databases HTTP/1.1\r\nHost: api\r\n" + auth + b"Connection: close\r\n\r\n")
        answer = read_to_eof(tls)
    assert status_lines(answer) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]


def test_chunked_body_reaches_the_app(env: ApiEnv, consumer: Consumer) -> None:
    body = iter([b'{"sizeClass"', b': "small"}'])  # a generator: requests sends it chunked
    response = env.call(
        "PUT", "/v1/databases/chunked", consumer.token, data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201
    assert response.json()["sizeClass"] == "small"


# -- TLS ------------------------------------------------------------------------------------------------


def client_context(env: ApiEnv, version: ssl.TLSVersion, ciphers: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(env.ca_file))
    context.minimum_version = context.maximum_version = version
    if ciphers:
        context.set_ciphers(ciphers)
    return context


def handshake(env: ApiEnv, context: ssl.SSLContext) -> str | None:
    """The negotiated cipher, or None if the server refused the handshake."""
    with socket.create_connection(("127.0.0.1", env.server.port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                cipher = tls.cipher()
                return cipher[0] if cipher else None
        except ssl.SSLError:
            return None


def test_tls_13_and_12_with_aead_are_served(env: ApiEnv) -> None:
    assert handshake(env, client_context(env, ssl.TLSVersion.TLSv1_3)) is not None
    cipher = handshake(env, client_context(env, ssl.TLSVersion.TLSv1_2))
    assert cipher is not None and ("GCM" in cipher or "CHACHA20" in cipher)


def test_cbc_suites_on_tls_12_are_refused(env: ApiEnv) -> None:
    context = client_context(env, ssl.TLSVersion.TLSv1_2, "ECDHE+AES:!AESGCM:!AESCCM:@SECLEVEL=0")
    offered = [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert offered and not any(c["aead"] for c in offered)  # on 1.2 the client offers CBC suites only
    assert handshake(env, context) is None


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_tls_below_12_is_refused(env: ApiEnv, version: ssl.TLSVersion) -> None:
    assert handshake(env, client_context(env, version, "ALL:@SECLEVEL=0")) is None


# -- helpers -------------------------------------------------------------------------------------------


class tls_connection:  # noqa: N801 - used like a function in `with`
    """A verified TLS connection to `port` (from `source`) with a generous read timeout."""

    def __init__(self, env: ApiEnv, port: int | None, source: str = "127.0.0.1") -> None:
        assert port is not None
        context = ssl.create_default_context(cafile=str(env.ca_file))
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0))
        self.tls = context.wrap_socket(self.raw, server_hostname="127.0.0.1")

    def __enter__(self) -> ssl.SSLSocket:
        return self.tls

    def __exit__(self, *exc: object) -> None:
        self.tls.close()


def read_to_eof(tls: ssl.SSLSocket) -> bytes:
    """Everything until the server closes; a read timeout (20 s) means it did not, and fails."""
    data = b""
    try:
        while chunk := tls.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLEOFError):
        pass
    return data


def status_lines(answer: bytes) -> list[bytes]:
    """The status lines of the answers (an answer's body is followed at once by the next one)."""
    return re.findall(rb"HTTP/1\.1 [0-9]{3} [A-Za-z ]+", answer)
