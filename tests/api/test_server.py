"""Serving: TLS, probes, the OpenAPI document, metrics by route template, access logs, limits, stop."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from pathlib import Path

import falcon
import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from api import ApiServer, create_app
from api.app import OPENAPI_PATH
from harness.certs import CertificateAuthority
from tests.api.support import ApiEnv, Served
from tests.support.common import wait_for


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


def test_probes(env: ApiEnv) -> None:
    assert env.call("GET", "/healthz").json() == {"status": "ok"}
    assert env.call("GET", "/readyz").json() == {"status": "ok"}


def test_readyz_follows_the_checks(env: ApiEnv) -> None:
    ready = threading.Event()
    app = create_app(env.config, env.components.store, env.components.tokens, ready_checks=[ready.is_set])
    with Served(app, env) as base:
        response = requests.get(f"{base}/readyz", verify=str(env.ca_file), timeout=10)
        assert response.status_code == 503
        assert response.json()["error"] == "unavailable"
        ready.set()
        assert requests.get(f"{base}/readyz", verify=str(env.ca_file), timeout=10).status_code == 200
        # Liveness does not depend on readiness.
        assert requests.get(f"{base}/healthz", verify=str(env.ca_file), timeout=10).status_code == 200


def test_served_openapi_equals_the_file(env: ApiEnv) -> None:
    on_disk = Path(OPENAPI_PATH).read_bytes()
    served_yaml = env.call("GET", "/openapi.yaml")
    assert served_yaml.status_code == 200
    assert served_yaml.content == on_disk
    served_json = env.call("GET", "/openapi.json")
    assert served_json.headers["Content-Type"].startswith("application/json")
    assert served_json.json() == yaml.safe_load(on_disk)


def test_openapi_lists_every_route(env: ApiEnv) -> None:
    document = yaml.safe_load(Path(OPENAPI_PATH).read_bytes())
    app_routes = {
        "/v1/databases": {"get"},
        "/v1/databases/{externalId}": {"put", "get", "delete"},
        "/v1/databases/{externalId}/credentials": {"get"},
        "/v1/databases/{externalId}/credentials/rotate": {"post"},
        "/v1/databases/{externalId}/undelete": {"post"},
        "/healthz": {"get"},
        "/readyz": {"get"},
        "/openapi.json": {"get"},
        "/openapi.yaml": {"get"},
    }
    documented = {path: {m for m in ops if m != "parameters"} for path, ops in document["paths"].items()}
    assert documented == app_routes
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    codes = set(document["components"]["schemas"]["Error"]["properties"]["error"]["enum"])
    assert {
        "invalid_body",
        "invalid_external_id",
        "unknown_size_class",
        "database_deleting",
        "quota_exceeded",
        "not_ready",
        "credentials_unavailable",
        "not_found",
        "unauthorized",
    } <= codes


def test_metrics_by_route_template(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    env.call("PUT", "/v1/databases/metered", consumer.token)
    env.call("GET", "/v1/databases/metered", consumer.token)
    env.call("GET", "/v1/databases/metered/credentials", consumer.token)
    env.call("GET", "/no/such/path", consumer.token)
    env.call("GET", "/v1/databases/metered")  # 401
    registry = env.registry
    template = "/v1/databases/{externalId}"
    assert sample(registry, "dbprovider_api_requests_total", {"method": "PUT", "route": template, "code": "201"})
    assert sample(registry, "dbprovider_api_requests_total", {"method": "GET", "route": template, "code": "200"})
    assert sample(registry, "dbprovider_api_requests_total", {"method": "GET", "route": template, "code": "401"})
    assert sample(
        registry,
        "dbprovider_api_requests_total",
        {"method": "GET", "route": template + "/credentials", "code": "409"},
    )
    assert sample(registry, "dbprovider_api_requests_total", {"method": "GET", "route": "unmatched", "code": "404"})
    count = sample(registry, "dbprovider_api_request_duration_seconds_count", {"method": "GET", "route": template})
    assert count is not None and count >= 2
    # No label value ever carries an externalId, a consumer or a path.
    for family in registry.collect():
        for s in family.samples:
            values = " ".join(s.labels.values())
            assert "metered" not in values and consumer.name not in values and "/no/such" not in values


def test_access_log_is_structured_and_clean(env: ApiEnv, caplog: pytest.LogCaptureFixture) -> None:
    consumer = env.ready_consumer()
    caplog.clear()
    env.call("PUT", "/v1/databases/logged", consumer.token)
    records = [r for r in caplog.records if r.name == "api.access"]
    wait_for(lambda: [r for r in caplog.records if r.name == "api.access"], what="an access log record")
    records = [r for r in caplog.records if r.name == "api.access"]
    entry = json.loads(records[-1].getMessage())
    assert entry == {
        "event": "api_request",
        "method": "PUT",
        "route": "/v1/databases/{externalId}",
        "status": 201,
        "durationSeconds": entry["durationSeconds"],
        "consumer": consumer.name,
    }
    assert records[-1].http == entry
    assert "Authorization" not in caplog.text and "Bearer" not in caplog.text


def test_plain_http_is_refused(env: ApiEnv) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{env.server.port}/healthz", timeout=5)


def test_tls_versions(env: ApiEnv) -> None:
    assert env.server.tls_context is not None
    assert env.server.tls_context.context.minimum_version == ssl.TLSVersion.TLSv1_2
    modern = ssl.create_default_context(cafile=str(env.ca_file))
    with socket.create_connection(("127.0.0.1", env.server.port), timeout=5) as raw:
        with modern.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_oversized_headers_are_refused(env: ApiEnv) -> None:
    response = env.call("GET", "/healthz", headers={"X-Padding": "x" * 40000})
    assert response.status_code in (413, 431)


def _tiny_app() -> falcon.App:
    app = falcon.App()

    class Slow:
        def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
            time.sleep(float(req.get_param("s") or 0))
            resp.media = {"ok": True}

    app.add_route("/slow", Slow())
    return app


def test_stop_frees_the_port(env: ApiEnv) -> None:
    served = Served(_tiny_app(), env)
    with served as base:
        assert requests.get(f"{base}/slow", verify=str(env.ca_file), timeout=10).json() == {"ok": True}
        port = served.server.port
    assert not served.server.running
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))  # free again
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"https://127.0.0.1:{port}/slow", verify=str(env.ca_file), timeout=5)


def test_idle_connection_times_out(env: ApiEnv) -> None:
    """A client that connects and sends nothing is dropped after the handshake/header deadline."""
    with Served(_tiny_app(), env, header_timeout=1) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            started = time.monotonic()
            assert raw.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 8
        # The server still answers afterwards.
        assert requests.get(f"{base}/slow", verify=str(env.ca_file), timeout=10).status_code == 200


def test_thread_pool_is_bounded(env: ApiEnv) -> None:
    """With 2 worker threads, 4 slow requests take two rounds: the pool does not grow."""
    with Served(_tiny_app(), env, threads=2) as base:
        results: list[int] = []

        def call() -> None:
            results.append(requests.get(f"{base}/slow?s=1", verify=str(env.ca_file), timeout=30).status_code)

        started = time.monotonic()
        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        elapsed = time.monotonic() - started
        assert results == [200] * 4
        assert elapsed >= 1.9


def test_certificate_is_reloaded(env: ApiEnv, tmp_path: Path) -> None:
    first_ca = CertificateAuthority(tmp_path / "one", "one")
    second_ca = CertificateAuthority(tmp_path / "two", "two")
    cert = first_ca.issue_server("srv")
    server = ApiServer(_tiny_app(), "127.0.0.1", 0, cert.cert_file, cert.key_file).start()
    try:
        base = f"https://127.0.0.1:{server.port}"
        assert requests.get(f"{base}/slow", verify=str(first_ca.ca_file), timeout=10).status_code == 200
        renewed = second_ca.issue_server("renewed")
        cert.cert_file.write_bytes(renewed.cert_file.read_bytes())
        cert.key_file.write_bytes(renewed.key_file.read_bytes())
        assert server.tls_context is not None
        server.tls_context.reload_interval = 0  # check at once
        wait_for(
            lambda: _trusted(f"{base}/slow", second_ca.ca_file),
            timeout=10,
            what="the renewed certificate",
        )
    finally:
        server.stop()


def _trusted(url: str, ca_file: Path) -> bool:
    try:
        return requests.get(url, verify=str(ca_file), timeout=5).status_code == 200
    except requests.exceptions.SSLError:
        return False


def test_connection_errors_go_to_logging(env: ApiEnv, caplog: pytest.LogCaptureFixture) -> None:
    with Served(_tiny_app(), env) as base:
        with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5) as raw:
            raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP on the TLS port
            try:
                raw.recv(1024)
            except ConnectionResetError:
                pass
        wait_for(lambda: any("tlsHandshake" in r.getMessage() for r in caplog.records), timeout=5, what="a log record")
    assert all(r.levelno <= logging.INFO for r in caplog.records if r.name == "api.server")
