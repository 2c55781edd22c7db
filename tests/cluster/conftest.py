"""Fixtures of the cluster suite: a one-node Kubernetes, the image built here, a shard behind a Service,
and a Pulumi stack that installs the provider as a platform engineer does. See README.md here.

Everything is module-scoped: test_install.py follows one install through its life, in file order.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from psycopg import sql

from domain.constants import API_VERSION
from domain.resources import CONSUMERS, SHARDS
from domain.settings import SETTINGS
from domain.tokens import hash_token
from harness import PostgresServer
from harness.certs import CertFiles, CertificateAuthority
from harness.images import Image, build_image
from harness.node import ExposedService, KubeNode
from harness.pulumi import REPO_ROOT, PulumiWorkspace
from informers import LEASES, SECRETS, Resource, Rest
from informers.leader import lease_holder
from tests.support.common import b64, shard_object, wait_for

NAMESPACE = "dbprovider"  # the install's defaults: release `dbprovider` in namespace `dbprovider`
RELEASE = "dbprovider"
TLS_SECRET = "dbprovider-tls"
API_HOST = f"{RELEASE}.{NAMESPACE}.svc"  # the name consumers reach the API by (the certificate's name)
SHARDS_NAMESPACE = "shards"
SHARD = "shard1"
MOVE_TARGET = "shard2"
ADMIN_SECRET = "shard1-provisioner"
CONSUMER = "team-a"
STACK = "node"
POD_SELECTOR = f"app.kubernetes.io/name=dbprovider,app.kubernetes.io/instance={RELEASE}"
PODS = Resource("", "v1", "pods")
# Figures measured on the way (seconds, bytes), printed at the end of the module and, with
# DBPROVIDER_CLUSTER_FIGURES=<file>, written there as JSON (docs/install.md quotes them).
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module")
def image() -> Image:
    """The provider image from this checkout's Dockerfile (hack/build-image.sh, cached by hash)."""
    return build_image()


@pytest.fixture(scope="module")
def node(image: Image) -> Iterator[KubeNode]:
    with KubeNode() as started:
        started.load_image(image)
        yield started


@pytest.fixture(scope="module")
def rest(node: KubeNode) -> Iterator[Rest]:
    with node.admin_client() as client:
        yield Rest(client)


@dataclass
class Shard:
    server: PostgresServer
    service: ExposedService


@pytest.fixture(scope="module")
def shard(node: KubeNode) -> Iterator[Shard]:
    """PostgreSQL 18 prepared as docs/sql.md says, offered to pods as the Service shard1-primary.shards.
    Its connection budget (max_connections 400, size class small 1 connection) holds the burst test's 200
    databases besides the others: placement counts connections, not only databases."""
    with PostgresServer("18", settings={"max_connections": "400"}) as server:
        with server.superuser_connection() as conn:
            conn.execute("REVOKE CONNECT ON DATABASE template1 FROM PUBLIC")
            conn.execute("REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE postgres TO {}").format(sql.Identifier(server.PROVISIONER)))
        yield Shard(server, node.expose_service(SHARDS_NAMESPACE, f"{SHARD}-primary", 5432, server.port))


@pytest.fixture(scope="module")
def move_target(node: KubeNode, shard: Shard, stack: Stack, rest: Rest) -> Iterator[Shard]:
    """A second PostgreSQL 18 shard, the Service shard2-primary.shards, whose Shard takes no new databases
    (placement keeps using shard1): the target of a move. Its provisioner has shard1's password, so the
    one admin Secret the install reads serves both."""
    server = PostgresServer("18")
    server.provisioner_password = shard.server.provisioner_password
    with server:  # prepared as docs/sql.md says (the harness does)
        second = Shard(server, node.expose_service(SHARDS_NAMESPACE, f"{MOVE_TARGET}-primary", 5432, server.port))
        create_shard(rest, second, MOVE_TARGET, accepting=False)
        yield second


@dataclass
class Stack:
    """The Pulumi stack and what its first `pulumi up` took."""

    workspace: PulumiWorkspace
    ca: CertificateAuthority
    up_seconds: float

    def up(self, *config: tuple[str, str]) -> float:
        """`pulumi config set` each (key, value), then `pulumi up`; returns how long the up took."""
        for key, value in config:
            self.workspace.ok("config", "set", "--path", "--plaintext", key, value)
        started = time.monotonic()
        self.workspace.ok("up", "--yes", "--skip-preview", timeout=900)
        return time.monotonic() - started


def _tls_secret(ca: CertificateAuthority, stem: str) -> dict[str, Any]:
    cert = ca.issue_server(stem, (API_HOST, f"{API_HOST}.cluster.local"), ())
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET, "namespace": NAMESPACE},
        "data": {"tls.crt": b64(cert.cert_file.read_bytes()), "tls.key": b64(cert.key_file.read_bytes())},
    }


def renewed_certificate(stack: Stack, stem: str) -> tuple[dict[str, Any], CertFiles]:
    """A new serving certificate from the same CA, as the TLS Secret a renewal writes."""
    secret = _tls_secret(stack.ca, stem)
    return secret, CertFiles(stack.ca.directory / f"{stem}.crt", stack.ca.directory / f"{stem}.key")


def prepare_install(node: KubeNode, rest: Rest, shard: Shard, workdir: Path) -> CertificateAuthority:
    """What docs/install.md asks for before the install: the release namespace, the API's TLS Secret
    (from a throwaway CA, returned) and the shard's admin Secret in its own namespace."""
    node.ensure_namespace(NAMESPACE)
    ca = CertificateAuthority(workdir / "api-pki", "dbprovider-api")
    rest.create(SECRETS, _tls_secret(ca, "api"), NAMESPACE)
    rest.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": ADMIN_SECRET, "namespace": SHARDS_NAMESPACE},
            "data": {"user": b64(shard.server.PROVISIONER), "password": b64(shard.server.provisioner_password)},
        },
        SHARDS_NAMESPACE,
    )
    return ca


@pytest.fixture(scope="module")
def stack(node: KubeNode, rest: Rest, image: Image, shard: Shard, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """What docs/install.md asks for first (the namespaces, the TLS Secret, the shard's admin Secret),
    then the README's `pulumi` lines with the image built here, and `pulumi up`."""
    workdir = tmp_path_factory.mktemp("cluster-pulumi")
    ca = prepare_install(node, rest, shard, workdir)
    project = workdir / "project"
    project.mkdir()
    settings = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(settings))  # main: infra/, the program unchanged
    (project / "infra").symlink_to(REPO_ROOT / "infra")
    kubeconfig = node.write_kubeconfig(workdir / "kubeconfig")
    workspace = PulumiWorkspace(workdir, project, kubeconfig)
    workspace.ok("stack", "init", STACK)
    stack = Stack(workspace, ca, 0.0)
    stack.up_seconds = stack.up(
        ("dbprovider:image", image.tag),
        ("dbprovider:tls.secretName", TLS_SECRET),
        ("dbprovider:shardSecrets[0].namespace", SHARDS_NAMESPACE),
        ("dbprovider:shardSecrets[0].name", ADMIN_SECRET),
        ("dbprovider:sizeClasses.small.connectionLimit", "1"),
        ("dbprovider:softDelete.retention", "0"),
    )
    return stack


@pytest.fixture(scope="module")
def consumer(stack: Stack, rest: Rest) -> str:
    return create_consumer(rest)


def create_consumer(rest: Rest) -> str:
    """A Consumer with a fresh token (its hash in a Secret); returns the token."""
    token = os.urandom(32).hex()
    rest.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{CONSUMER}-token", "namespace": NAMESPACE},
            "data": {"token": b64(hash_token(token))},
        },
        NAMESPACE,
    )
    rest.create(
        CONSUMERS,
        {
            "apiVersion": API_VERSION,
            "kind": "Consumer",
            "metadata": {"name": CONSUMER},
            "spec": {
                "tokenSecretRef": {"namespace": NAMESPACE, "name": f"{CONSUMER}-token", "key": "token"},
                "maxDatabases": 400,
            },
        },
    )
    return token


@pytest.fixture(scope="module")
def shard_ready(stack: Stack, rest: Rest, shard: Shard) -> str:
    return create_shard(rest, shard)


def create_shard(rest: Rest, shard: Shard, name: str = SHARD, accepting: bool = True) -> str:
    """The Shard, Ready: the leader reached PostgreSQL by the Service's name through cluster DNS."""
    spec = {
        "maxDatabases": 400,
        "accepting": accepting,
        "perconaCluster": {"namespace": SHARDS_NAMESPACE, "name": name},
        "admin": {
            "serviceName": shard.service.name,
            "port": shard.service.port,
            "sslmode": "require",
            "secretRef": {"namespace": SHARDS_NAMESPACE, "name": ADMIN_SECRET},
        },
        "client": {"host": shard.service.host, "port": shard.service.port, "sslmode": "require"},
    }
    rest.create(SHARDS, shard_object(name, spec))

    def ready() -> bool:
        conditions = (rest.get(SHARDS, name).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, timeout=90, what=f"Shard {name} Ready")
    return name


class ApiClient:
    """The consumer API through its Service (ClusterIP:443), one TLS connection per request, checking
    the certificate against the Service's name as a consumer in the cluster would."""

    def __init__(self, node: KubeNode, cluster_ip: str, ca_file: Path, token: str) -> None:
        self.node = node
        self.port = node.forward(cluster_ip, 443)
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.token = token

    def connection(self, timeout: float = 10, port: int | None = None) -> http.client.HTTPSConnection:
        connection = http.client.HTTPSConnection(API_HOST, 443, timeout=timeout, context=self.context)
        raw = socket.create_connection(("127.0.0.1", port or self.port), timeout=timeout)
        connection.sock = self.context.wrap_socket(raw, server_hostname=API_HOST)
        return connection

    def call(
        self, method: str, path: str, body: Any = None, timeout: float = 10, port: int | None = None
    ) -> tuple[int, Any]:
        """One request through the Service, or through `port` (a forward to one pod) when given."""
        connection = self.connection(timeout, port)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Connection": "close"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            connection.close()

    def served_certificate(self, pod_ip: str | None = None) -> bytes:
        """The DER certificate the API presents right now (through the Service, or by one pod)."""
        connection = self.connection(port=self.node.forward(pod_ip, SETTINGS.ports.api) if pod_ip else None)
        try:
            return connection.sock.getpeercert(binary_form=True)
        finally:
            connection.close()


@pytest.fixture(scope="module")
def api(node: KubeNode, stack: Stack, consumer: str) -> ApiClient:
    return api_client(node, stack.ca, consumer)


def api_client(node: KubeNode, ca: CertificateAuthority, token: str) -> ApiClient:
    """A consumer of `token` calling the API's Service."""
    with node.admin_client() as client:
        service = kubernetes.client.CoreV1Api(client).read_namespaced_service(RELEASE, NAMESPACE)
    return ApiClient(node, service.spec.cluster_ip, ca.ca_file, token)


def wait_phase(api: ApiClient, external_id: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    """The database as the consumer reads it once it is in `phase`; else the last answer in the error."""
    last: list[object] = [None]

    def probe() -> dict[str, Any] | None:
        status, body = api.call("GET", f"/v1/databases/{external_id}")
        last[0] = (status, body)
        return body if status == 200 and body.get("phase") == phase else None

    try:
        return wait_for(probe, timeout=timeout, what=f"database {external_id} {phase}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last[0]}") from None


@dataclass
class Caller:
    """A consumer calling the API through its Service every 100 ms (a GET and an idempotent PUT of an
    existing database, in turn), each call on a new connection; it records every call that failed."""

    api: ApiClient
    external_id: str
    calls: int = 0
    longest_pause: float = 0.0  # seconds between the starts of two calls in a row
    failures: list[str] = field(default_factory=list)  # "<sent, seconds from `started`>s <method> <what>"
    started: float = 0.0  # time.monotonic() when it began calling
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Caller:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = last = self.started
        while not self._stop.is_set():
            now = time.monotonic()
            self.longest_pause, last = max(self.longest_pause, now - last), now
            method, body = ("GET", None) if self.calls % 2 == 0 else ("PUT", {"sizeClass": "small"})
            try:
                status, body = self.api.call(method, f"/v1/databases/{self.external_id}", body)
                if status != 200:
                    self.failures.append(f"{now - started:.1f}s {method} {status} {body}")
            except Exception as exc:  # noqa: BLE001 - every kind of failure is what we count
                took = time.monotonic() - now
                self.failures.append(f"{now - started:.1f}s {method} {type(exc).__name__} after {took:.1f}s: {exc}")
            self.calls += 1
            self._stop.wait(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)


# -- reading the pods ------------------------------------------------------------------------------


def pods(rest: Rest) -> list[dict[str, Any]]:
    """The provider's pods that are not terminating, by name."""
    found = rest.list(PODS, NAMESPACE, query=[("labelSelector", POD_SELECTOR)])["items"]
    return sorted((p for p in found if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


def ready_pods(rest: Rest) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(rest)
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]


def leader(rest: Rest) -> str:
    """Who leads, read as the replicas read the Lease: "" while none does, also when the last leader released it
    on shutdown (a released Lease still names its holder for older releases' sake: informers/leader.py)."""
    return lease_holder(rest.get(LEASES, f"{RELEASE}-manager", NAMESPACE)) or ""


def ready_leader_pod(rest: Rest, timeout: float = 120) -> dict[str, Any]:
    """A Ready pod holding the Lease. After a roll or a restart the Lease may be released or name a pod that is
    gone or not Ready yet (a loaded machine can fail one readiness probe): wait for one rather than assume it."""
    return wait_for(
        lambda: next((p for p in ready_pods(rest) if p["metadata"]["name"] == leader(rest)), None),
        timeout=timeout,
        what="a Ready pod holding the Lease",
    )


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return status


def exec_in(node: KubeNode, pod: str, *argv: str, stdin: str | None = None) -> str:
    """Run a command in the manager container (kubectl exec, through the apiserver and the kubelet)."""
    args = ["-n", NAMESPACE, "exec", *(["-i"] if stdin is not None else []), pod, "-c", "manager", "--", *argv]
    result = node.kubectl(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rss_bytes(node: KubeNode, pod: dict[str, Any]) -> int:
    """Resident memory of the pod's manager container (its processes' VmRSS, as the host reads it)."""
    total = 0
    for pid in node.container_pids(container(pod)["containerID"]):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if FIGURES:
        text = json.dumps(FIGURES, indent=1, sort_keys=True)
        print(f"\ncluster figures: {text}")
        if target := os.environ.get("DBPROVIDER_CLUSTER_FIGURES"):
            Path(target).write_text(text + "\n")
