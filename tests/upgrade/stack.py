"""Where the upgrade scenario runs: a control plane of its own, two shards, and replicas of either release.

`ProcessCluster` is the apiserver harness with `dbprovider manager` processes (as tests/e2e and
tests/faults start them): each release's own CLI renders its install (`dbprovider render`), the
manifests are server-side applied (CRDs first, then the rest, as `pulumi up` or Flux would), and
each replica runs that release's `dbprovider manager` with the install config from that release's
rendered ConfigMap and a token of the provider's ServiceAccount (so each release's RBAC is what
it runs with). The "Deployment" is the list of replicas; the "Service" sends each request to a
Ready replica, round robin, and a replica leaves it before it is stopped.

The scenario (tests/upgrade/scenario.py) talks to it through the `Cluster` protocol only, so the
same phases and invariants can run on the one-node Kubernetes with pods.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
import yaml
from kubernetes.client.exceptions import ApiException

from dbprovider.kubeapply import Applier
from domain.constants import API_VERSION, KIND_CONSUMER, KIND_SHARD
from domain.credentials import opaque_secret
from domain.resources import CONSUMERS, SHARDS
from harness import PostgresServer
from harness.certs import CertificateAuthority
from harness.releases import REPO, BuiltRelease
from informers import LEASES, SECRETS, Rest
from informers.leader import lease_holder
from tests.support.audit import audited_control_plane, controller_writes
from tests.support.manager_process import ManagerProcess

RELEASE = "upg"
NAMESPACE = "upg-system"
SHARD_SECRETS_NAMESPACE = "upg-shards"
LEASE = f"{RELEASE}-manager"

# The install values both releases render from (keys of 0.1.0; every later release reads them too).
VALUES: dict[str, Any] = {
    "releaseName": RELEASE,
    "namespace": NAMESPACE,
    "replicas": 2,
    "tls": {"secretName": f"{RELEASE}-tls"},
    "sizeClasses": {"small": {"connectionLimit": 5}, "large": {"connectionLimit": 50}},
    "connectionLimit": {"default": 10},
    "deletionProtection": {"enabled": False},
    # Deleting databases must still be Deleting after the upgrade: retention outlasts the test.
    "softDelete": {"retention": "1h"},
}


@dataclass(frozen=True)
class Runtime:
    """How to run one release's `dbprovider` on this machine."""

    version: str
    prefix: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    cwd: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *args], env=self.env, cwd=self.cwd, capture_output=True, text=True, check=False
        )

    def render(self, values_file: Path) -> list[dict[str, Any]]:
        """The install's manifests, rendered by this release's own CLI."""
        out = self.run("render", "--config", str(values_file))
        assert out.returncode == 0, f"{self.version} render failed: {out.stderr[-2000:]}"
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _pre_stop_seconds(manifests: list[dict[str, Any]]) -> float:
    """The Deployment's preStop delay (`sleep N`), 0 without one (0.1.0 had none)."""
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    command = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command") or []
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def this_checkout(version: str) -> Runtime:
    env = {k: v for k, v in os.environ.items() if k not in ("DBPROVIDER_TEMPLATES",)}
    return Runtime(version, (sys.executable, "-m", "dbprovider.cli"), env, REPO)


def built_release(built: BuiltRelease) -> Runtime:
    return Runtime(built.release.version, (str(built.root / "venv" / "bin" / "dbprovider"),), built.env(), built.root)


class Replica(ManagerProcess):
    """One `dbprovider manager` process of a release."""

    def __init__(self, cluster: ProcessCluster, runtime: Runtime, name: str) -> None:
        super().__init__(name, cluster.root / f"{name}.log", str(cluster.ca_file))
        self.runtime = runtime
        self.stopped_at: float | None = None  # when it got SIGTERM or SIGKILL
        env = {**runtime.env, "DBPROVIDER_TLS_CERT": str(cluster.tls_cert), "DBPROVIDER_TLS_KEY": str(cluster.tls_key)}
        argv = [
            *runtime.prefix,
            "manager",
            "--config",
            str(cluster.config_file),
            "--kubeconfig",
            str(cluster.manager_kubeconfig),
            "--api-port",
            str(self.api_port),
            "--metrics-port",
            str(self.metrics_port),
            "--admin-host-override",
            "127.0.0.1",
        ]
        self.spawn(argv, env, runtime.cwd)


@dataclass
class Answer:
    """One request through the Service: when, which replica answered, the status (0: no answer)."""

    when: float
    replica: str
    status: int
    body: Any = None


class ProcessCluster:
    """A kube-apiserver + etcd (audit log on), shards A (PostgreSQL 18) and B (15) logging every
    statement, the provider's install, and manager replicas of any release."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.namespace = NAMESPACE
        self.replicas: list[Replica] = []
        self.endpoints: list[Replica] = []  # the Service's ready endpoints
        self.config_file = root / "config.yaml"  # the mounted ConfigMap
        self.pre_stop: dict[str, float] = {}  # release -> its Deployment's preStop delay (seconds)
        self.manifests: dict[str, list[dict[str, Any]]] = {}
        self._round_robin = itertools.count()
        self._lock = threading.Lock()
        self._names = itertools.count()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ProcessCluster:
        self.kube, self.audit_log = audited_control_plane(self.root / "kube")
        self._client = self.kube.admin_client()
        self.rest = Rest(self._client)
        self.shard_servers: dict[str, PostgresServer] = {
            "upg-pg-a": PostgresServer("18", log_statements=True).start(),
            "upg-pg-b": PostgresServer("15", log_statements=True).start(),
        }
        for namespace in (NAMESPACE, SHARD_SECRETS_NAMESPACE):
            self.kube.ensure_namespace(namespace)
        self.values_file = self.root / "values.yaml"
        self.values_file.write_text(yaml.safe_dump(self.values()))
        return self

    def values(self) -> dict[str, Any]:
        listed = [
            {"namespace": SHARD_SECRETS_NAMESPACE, "name": f"{shard}-provisioner"} for shard in self.shard_servers
        ]
        return {**VALUES, "shardSecrets": listed}

    def close(self) -> None:
        for replica in self.replicas:
            replica.kill()
        for server in self.shard_servers.values():
            server.close()
        self._client.close()
        self.kube.close()

    # -- install -----------------------------------------------------------------------------

    def install(self, runtime: Runtime) -> list[dict[str, Any]]:
        """`runtime`'s rendered install, applied: the CRDs first (until Established), then the rest.

        Its ConfigMap's config.yaml is what every replica started from now on reads, whatever its
        release: a pod mounts the ConfigMap by name, so an old pod restarted mid-rollout reads the
        new one.
        """
        manifests = runtime.render(self.values_file)
        Applier(self.rest).apply_all(manifests)
        config_map = next(m for m in manifests if m["kind"] == "ConfigMap")
        self.config_file.write_text(config_map["data"]["config.yaml"])
        self.manifests[runtime.version] = manifests
        self.pre_stop[runtime.version] = _pre_stop_seconds(manifests)
        return manifests

    def register(self, consumers: dict[str, str], disabled: tuple[str, ...] = ()) -> None:
        """Once: the API's TLS Secret, the shards with their admin Secrets, consumers with their token
        hashes (`consumers`: name -> token), and the managers' kubeconfig (a ServiceAccount token)."""
        authority = CertificateAuthority(self.root / "pki", "upgrade-api")
        cert = authority.issue_server("api", ("localhost",))
        self.ca_file, self.tls_cert, self.tls_key = authority.ca_file, cert.cert_file, cert.key_file
        self._secret(
            f"{RELEASE}-tls",
            NAMESPACE,
            {"tls.crt": cert.cert_file.read_text(), "tls.key": cert.key_file.read_text()},
            "kubernetes.io/tls",
        )
        for name, server in self.shard_servers.items():
            self._secret(
                f"{name}-provisioner",
                SHARD_SECRETS_NAMESPACE,
                {"user": server.PROVISIONER, "password": server.provisioner_password},
            )
            self.rest.create(
                SHARDS,
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND_SHARD,
                    "metadata": {"name": name},
                    "spec": {
                        "maxDatabases": 50,
                        "perconaCluster": {"namespace": NAMESPACE, "name": name},
                        "admin": {
                            "serviceName": f"{name}-primary",
                            "port": server.port,
                            "sslmode": "require",
                            "secretRef": {"namespace": SHARD_SECRETS_NAMESPACE, "name": f"{name}-provisioner"},
                        },
                        "client": {"host": "127.0.0.1", "port": server.port, "sslmode": "require"},
                    },
                },
            )
        from domain.tokens import hash_token

        for name, token in consumers.items():
            self._secret(f"{name}-token", NAMESPACE, {"sha256": hash_token(token)})
            self.rest.create(
                CONSUMERS,
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND_CONSUMER,
                    "metadata": {"name": name},
                    "spec": {
                        "tokenSecretRef": {"namespace": NAMESPACE, "name": f"{name}-token", "key": "sha256"},
                        "maxDatabases": 30,
                        "disabled": name in disabled,
                    },
                },
            )
        token = self.kube.service_account_token(NAMESPACE, RELEASE, seconds=24 * 3600)
        self.manager_kubeconfig = self.kube.write_kubeconfig(self.root / "manager.kubeconfig", token=token)
        self.admin_kubeconfig = self.kube.write_kubeconfig(self.root / "admin.kubeconfig")

    def _secret(self, name: str, namespace: str, data: dict[str, str], type_: str = "Opaque") -> None:
        self.rest.create(SECRETS, opaque_secret(name, namespace, data, type_), namespace)

    # -- the Deployment ----------------------------------------------------------------------

    def start_replica(self, runtime: Runtime) -> Replica:
        """A new replica of `runtime`'s release; it joins the Service once Ready."""
        name = f"{RELEASE}-{runtime.version.replace('.', '-')}-{next(self._names)}"
        for attempt in range(3):  # a port picked free may be taken by another process before the bind
            replica = Replica(self, runtime, name)
            self.replicas.append(replica)
            try:
                replica.wait_ready()
                break
            except AssertionError:
                if attempt == 2 or "Address already in use" not in replica.log.read_text(errors="replace"):
                    raise
                replica.kill()
        with self._lock:
            self.endpoints.append(replica)
        return replica

    def stop_replica(self, replica: Replica, *, kill: bool = False) -> None:
        """Out of the Service first, then its release's preStop delay, then SIGTERM (or at once
        SIGKILL: a crash). Requests routed to it just before it left the Service still arrive during
        the delay, as kube-proxy's lag lets them."""
        with self._lock:
            if replica in self.endpoints:
                self.endpoints.remove(replica)
        if not kill:
            time.sleep(self.pre_stop.get(replica.runtime.version, 0.0))
        replica.stopped_at = time.monotonic()
        if kill:
            replica.kill()
        else:
            replica.stop()

    def running(self, version: str | None = None) -> list[Replica]:
        return [r for r in self.replicas if r.proc.poll() is None and (version is None or r.runtime.version == version)]

    def rolling_update(self, runtime: Runtime, between: Any = None) -> None:
        """The Deployment's rolling update (maxSurge 1, maxUnavailable 0): for each old replica, a new
        one first (until Ready), then the old one out of the Service and stopped. `between(step)` runs
        after each new replica is Ready, before the old one goes."""
        old = [r for r in self.running() if r.runtime.version != runtime.version]
        for step, replica in enumerate(old):
            self.start_replica(runtime)
            if between is not None:
                between(step)
            self.stop_replica(replica)

    def scale_to_zero(self) -> None:
        for replica in self.running():
            self.stop_replica(replica)

    def holder(self) -> str | None:
        try:
            return lease_holder(self.rest.get(LEASES, LEASE, NAMESPACE))
        except ApiException:
            return None

    def lease(self) -> dict[str, Any] | None:
        try:
            return self.rest.get(LEASES, LEASE, NAMESPACE)
        except ApiException:
            return None

    # -- the Service -------------------------------------------------------------------------

    def call(self, token: str, method: str, path: str, *, replica: Replica | None = None, **kwargs: Any) -> Answer:
        """One request to a Ready replica (round robin), as a consumer through the Service; or to
        `replica` itself."""
        if replica is None:
            with self._lock:
                endpoints = list(self.endpoints)
            if not endpoints:
                return Answer(time.monotonic(), "", 0)
            replica = endpoints[next(self._round_robin) % len(endpoints)]
        headers = {"Authorization": f"Bearer {token}"}
        try:
            response = requests.request(
                method, replica.url(path), headers=headers, verify=replica.ca, timeout=15, **kwargs
            )
        except requests.RequestException:
            return Answer(time.monotonic(), replica.name, 0)
        try:
            body = response.json()
        except ValueError:
            body = None
        return Answer(time.monotonic(), replica.name, response.status_code, body)

    # -- observation -------------------------------------------------------------------------

    def controller_writes(self) -> list[tuple[datetime, str, str]]:
        """(time, replica, "verb resource/name") of every write the controllers made (the Lease and
        Events excluded), from the audit log."""
        return [(w.when, w.replica, w.what) for w in controller_writes(self.audit_log) if " events/" not in w.what]
