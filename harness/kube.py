"""A real etcd + kube-apiserver on loopback with RBAC on, like controller-runtime's envtest.

The binaries are built from the Go module proxy by hack/build-kube.sh (pinned in hack/kube/go.mod).
Clients authenticate with client certificates (any user and groups, issued on demand) or with real
ServiceAccount tokens from the TokenRequest API.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import kubernetes.client
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.certs import CertFiles, CertificateAuthority, make_rsa_keypair
from harness.process import built_dir, free_port, spawn, stop, wait_for_port

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-kube.sh"
ADMIN_USER = "harness-admin"


class MissingBinaryError(RuntimeError):
    """kube-apiserver or etcd has not been built yet."""


def binaries_dir() -> Path:
    """Where hack/build-kube.sh puts the binaries for the pinned version (DBPROVIDER_KUBE_BIN overrides)."""
    return built_dir(BUILD_SCRIPT, "DBPROVIDER_KUBE_BIN")


def pinned_kube_version() -> str:
    """The Kubernetes version hack/kube/go.mod pins, e.g. v1.34.4."""
    for line in (REPO_ROOT / "hack" / "kube" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "k8s.io/kubernetes":
            return parts[1]
    raise RuntimeError("hack/kube/go.mod pins no k8s.io/kubernetes version")


def etcd_command(bin_dir: Path, data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """A single-member etcd for a test control plane (no fsync: its data lives as long as the test)."""
    return [
        str(bin_dir / "etcd"),
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        f"default={peer_url}",
        "--unsafe-no-fsync",
        "--log-level",
        "warn",
    ]


def apiserver_command(
    bin_dir: Path,
    *,
    etcd_url: str,
    bind_address: str,
    advertise_address: str,
    port: int,
    serving: CertFiles,
    client_ca: Path,
    service_account_keys: tuple[Path, Path],
    service_cidr: str,
    cert_dir: Path,
    authorization_mode: str = "RBAC",
) -> list[str]:
    """A kube-apiserver on `etcd_url`, serving TLS, clients by certificate, ServiceAccount tokens signed
    with `service_account_keys` (public, private)."""
    sa_pub, sa_key = service_account_keys
    return [
        str(bin_dir / "kube-apiserver"),
        "--etcd-servers",
        etcd_url,
        "--bind-address",
        bind_address,
        "--advertise-address",
        advertise_address,
        "--secure-port",
        str(port),
        "--tls-cert-file",
        str(serving.cert_file),
        "--tls-private-key-file",
        str(serving.key_file),
        "--client-ca-file",
        str(client_ca),
        "--authorization-mode",
        authorization_mode,
        "--service-account-issuer",
        "https://kubernetes.default.svc",
        "--service-account-key-file",
        str(sa_pub),
        "--service-account-signing-key-file",
        str(sa_key),
        "--service-cluster-ip-range",
        service_cidr,
        "--allow-privileged=true",
        "--cert-dir",
        str(cert_dir),
        "--v",
        "1",
    ]


class KubeControlPlane:
    """etcd and kube-apiserver in a temporary directory; `close()` stops both and removes it."""

    def __init__(
        self, bin_dir: Path | None = None, workdir: Path | None = None, extra_args: list[str] | None = None
    ) -> None:
        """`extra_args` are appended to the kube-apiserver argv (e.g. `--etcd-compaction-interval=1s`)."""
        self.bin_dir = bin_dir or binaries_dir()
        self.extra_args = list(extra_args or [])
        for name in ("kube-apiserver", "etcd"):
            if not os.access(self.bin_dir / name, os.X_OK):
                raise MissingBinaryError(
                    f"{name} not found in {self.bin_dir}: build it with `bash hack/build-kube.sh` "
                    "(builds the pinned kube-apiserver and etcd from the Go module proxy; a cold build "
                    "takes several minutes, later runs reuse the cache)"
                )
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="dbprovider-kube-"))
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._clients: dict[tuple[str, tuple[str, ...]], CertFiles] = {}
        self.port = 0
        self._etcd_ports: tuple[int, int] | None = None
        self.ca: CertificateAuthority | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> KubeControlPlane:
        try:
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start_etcd(self, timeout: float) -> None:
        client_port, peer_port = self._etcd_ports = self._etcd_ports or (free_port(), free_port())
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        self._etcd = spawn(
            etcd_command(self.bin_dir, self.workdir / "etcd", self.etcd_url, f"http://127.0.0.1:{peer_port}"),
            self.workdir / "etcd.log",
        )
        wait_for_port(client_port, timeout, self._etcd, self.workdir / "etcd.log")

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.workdir / "pki"
        self.ca = CertificateAuthority(pki, "kube")
        serving = self.ca.issue_server("apiserver", ("localhost", "kubernetes", "kubernetes.default.svc"))
        sa_key, sa_pub = make_rsa_keypair(pki, "service-account")
        self.port = free_port()
        log = self.workdir / "apiserver.log"
        self._apiserver = spawn(
            [
                *apiserver_command(
                    self.bin_dir,
                    etcd_url=self.etcd_url,
                    bind_address="127.0.0.1",
                    advertise_address="127.0.0.1",
                    port=self.port,
                    serving=serving,
                    client_ca=self.ca.ca_file,
                    service_account_keys=(sa_pub, sa_key),
                    service_cidr="10.0.0.0/24",
                    cert_dir=pki,
                ),
                *self.extra_args,
            ],
            log,
        )
        wait_for_port(self.port, timeout, self._apiserver, log)
        self._wait_ready(timeout, log)

    def _wait_ready(self, timeout: float, log: Path) -> None:
        """Poll /readyz as admin until the apiserver (and its RBAC bootstrap) is ready."""
        deadline = time.monotonic() + timeout
        last = ""
        with self.admin_client() as api:
            while time.monotonic() < deadline:
                if self._apiserver is not None and self._apiserver.poll() is not None:
                    raise RuntimeError(f"kube-apiserver exited with {self._apiserver.returncode}; see {log}")
                try:
                    response = api.call_api("GET", f"{self.url}/readyz")
                    response.read()
                    if response.status != 200:
                        raise RuntimeError(f"/readyz answered {response.status}")
                    # RBAC bootstrap roles exist once the apiserver is ready; check one to be sure.
                    kubernetes.client.RbacAuthorizationV1Api(api).read_cluster_role("view")
                    return
                except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
                    last = type(exc).__name__
                    time.sleep(0.25)
        raise TimeoutError(f"kube-apiserver not ready within {timeout:.0f}s ({last}); see {log}")

    @property
    def apiserver_pid(self) -> int | None:
        """kube-apiserver's PID while it runs (fault tests pause it)."""
        return self._apiserver.pid if self._apiserver is not None and self._apiserver.poll() is None else None

    @property
    def etcd_pid(self) -> int | None:
        return self._etcd.pid if self._etcd is not None and self._etcd.poll() is None else None

    def restart_etcd(self, timeout: float = 60.0, *, down_for: float = 0.0) -> None:
        """SIGKILL etcd, wait `down_for` seconds, start it again on the same data directory and
        ports (the apiserver reconnects by itself); returns once it listens again."""
        stop(self._etcd, signal.SIGKILL, timeout=10)
        self._etcd = None
        time.sleep(down_for)
        self._start_etcd(timeout)

    def close(self) -> None:
        # Throwaway state: a short grace period, then SIGKILL (a loaded apiserver may take long to drain).
        stop(self._apiserver, timeout=5)
        stop(self._etcd, timeout=5)
        self._apiserver = self._etcd = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clients -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _client_cert(self, user: str, groups: tuple[str, ...]) -> CertFiles:
        assert self.ca is not None, "control plane not started"
        key = (user, groups)
        if key not in self._clients:
            self._clients[key] = self.ca.issue_client(f"client-{len(self._clients)}", user, groups)
        return self._clients[key]

    def configuration(
        self, user: str | None = None, groups: tuple[str, ...] = (), token: str | None = None
    ) -> kubernetes.client.Configuration:
        """Client configuration as `user` in `groups` (client certificate) or with a bearer token."""
        assert self.ca is not None, "control plane not started"
        config = kubernetes.client.Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.ca.ca_file)
        if token is not None:
            config.api_key = {"authorization": f"Bearer {token}"}
        else:
            cert = self._client_cert(user or ADMIN_USER, groups if user else ("system:masters",))
            config.cert_file, config.key_file = str(cert.cert_file), str(cert.key_file)
        return config

    def admin_client(self) -> ApiClient:
        """A client in group system:masters."""
        return ApiClient(self.configuration())

    def client_as(self, user: str, groups: tuple[str, ...] = ()) -> ApiClient:
        """A client authenticated as `user` with `groups` (and system:authenticated)."""
        return ApiClient(self.configuration(user, groups))

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A real token for ServiceAccount namespace/name from the TokenRequest API (created if missing)."""
        self.ensure_namespace(namespace)
        with self.admin_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            try:
                account = kubernetes.client.V1ServiceAccount(metadata=kubernetes.client.V1ObjectMeta(name=name))
                core.create_namespaced_service_account(namespace, account)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            request = kubernetes.client.AuthenticationV1TokenRequest(
                spec=kubernetes.client.V1TokenRequestSpec(
                    audiences=["https://kubernetes.default.svc"], expiration_seconds=seconds
                )
            )
            result = core.create_namespaced_service_account_token(name, namespace, request)
            if result.status is None or not result.status.token:
                raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
            return result.status.token

    def service_account_client(self, namespace: str, name: str) -> ApiClient:
        return ApiClient(self.configuration(token=self.service_account_token(namespace, name)))

    def ensure_namespace(self, name: str) -> None:
        with self.admin_client() as api:
            try:
                namespace = kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name))
                kubernetes.client.CoreV1Api(api).create_namespace(namespace)
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def write_kubeconfig(
        self, path: Path, user: str | None = None, groups: tuple[str, ...] = (), token: str | None = None
    ) -> Path:
        """A kubeconfig file for kubectl and for the manager (admin unless user/token given)."""
        assert self.ca is not None, "control plane not started"
        if token is not None:
            credentials: dict[str, str] = {"token": token}
        else:
            cert = self._client_cert(user or ADMIN_USER, groups if user else ("system:masters",))
            credentials = {"client-certificate": str(cert.cert_file), "client-key": str(cert.key_file)}
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": self.url, "certificate-authority": str(self.ca.ca_file)}}
            ],
            "users": [{"name": "local", "user": credentials}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "local"}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path

    def apiserver_log(self) -> Path:
        return self.workdir / "apiserver.log"
