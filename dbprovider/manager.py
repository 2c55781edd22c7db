"""`dbprovider manager`: one replica of the provider.

The composition root: the only place that imports both `api` and `reconciler`. It builds the
shared informers, registers the controllers (run only while this replica holds the Lease) and the
consumer API (served by every replica), serves /metrics, and stops in order on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
import prometheus_client
from kubernetes.client import ApiClient

from api import ApiServer, build_api
from api.server import DEFAULT_THREADS, front_door_options
from dbprovider.logs import configure_logging
from domain.config import InstallConfig, load_install_config_file
from domain.settings import SETTINGS
from reconciler.fleet_metrics import FleetCollector
from reconciler.resources import DATABASES, SHARDS
from reconciler.runtime import ControllerManager, MetricsServer, start_metrics_server
from reconciler.setup import register_controllers

log = logging.getLogger(__name__)
CONNECTION_POOL_SIZE = 48  # one per watch plus the API's threads and the Shard and Consumer workers


@dataclass
class ManagerOptions:
    config: InstallConfig
    namespace: str
    kubeconfig: str | None = None
    api_host: str = "0.0.0.0"  # noqa: S104 - the Service routes to it
    api_port: int = SETTINGS.ports.api
    metrics_host: str = "0.0.0.0"  # noqa: S104
    metrics_port: int = SETTINGS.ports.metrics
    tls_cert: str = SETTINGS.files.tls_cert
    tls_key: str = SETTINGS.files.tls_key
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    admin_host_override: str | None = None
    # The shard CA bundle outside a pod (--shard-ca-file); None: the mounted one if shardTLS.caBundle is set.
    shard_ca_file: str | None = None
    api_threads: int = DEFAULT_THREADS
    # Tests shorten these (and the backoff cap, along with the alert rules' windows).
    lease_duration: float = SETTINGS.lease.duration
    renew_deadline: float = SETTINGS.lease.renew_deadline
    retry_period: float = SETTINGS.lease.retry_period
    shard_ping_interval: float = SETTINGS.shard_checks.ready_interval
    max_backoff: float | None = None  # the retry backoff cap; None = SETTINGS.retry.reconcile's


def kube_client(kubeconfig: str | None, identity: str | None = None, workers: int = 0) -> ApiClient:
    """In-cluster credentials, or a kubeconfig file (outside a cluster: dev and tests).

    With `identity` the User-Agent is `dbprovider/<identity>`, so the apiserver's audit log tells
    the replicas apart (which one wrote what, and when). `workers` (the Database workers) adds one
    pooled connection each, so a burst does not open and drop connections to the apiserver.
    """
    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE + workers
    client = ApiClient(configuration)
    if identity:
        client.user_agent = f"dbprovider/{identity}"
    return client


class Manager:
    """A running replica: `start()`, then `stop()` (from a signal handler's thread of choice)."""

    def __init__(self, options: ManagerOptions) -> None:
        # Counters and histograms export no `*_created` series: nothing reads them, and every family
        # would carry a second, constant series per label set.
        prometheus_client.disable_created_metrics()
        self.options = options
        self.client = kube_client(options.kubeconfig, options.identity, options.config.workers_total)
        self.controllers = ControllerManager(
            self.client,
            lease_namespace=options.namespace,
            lease_name=f"{options.config.release_name}-manager",
            identity=options.identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
            max_backoff=options.max_backoff,
        )
        self.reconcilers = register_controllers(
            self.controllers,
            options.config,
            options.namespace,
            instance=options.identity,
            admin_host_override=options.admin_host_override,
            shard_ca_file=options.shard_ca_file,
            shard_ping_interval=options.shard_ping_interval,
        )
        registry = self.controllers.metrics.registry
        informers = self.controllers.informers
        shards, databases = informers.informer(SHARDS), informers.informer(DATABASES, options.namespace)
        registry.register(FleetCollector(shards.list, databases.list))
        self.api = build_api(
            options.config, informers, registry=registry, apiserver_reachable=self.controllers.apiserver_reachable
        )
        self.api_server = ApiServer(
            self.api.app,
            options.api_host,
            options.api_port,
            options.tls_cert,
            options.tls_key,
            threads=options.api_threads,
            registry=registry,
            **front_door_options(options.config.api),  # deadlines and connection bounds: api.* keys
        )
        self.metrics_server: MetricsServer | None = None

    def start(self) -> Manager:
        self.metrics_server = start_metrics_server(
            self.options.metrics_port, self.controllers.metrics.registry, self.options.metrics_host
        )
        self.api_server.start()  # /healthz answers while the caches sync; /readyz waits for them
        self.controllers.start()
        log.info(
            "manager started",
            extra={"api_port": self.api_server.port, "metrics_port": self.metrics_server.port},
        )
        return self

    def ready(self) -> bool:
        """What /readyz answers: the API's caches are synced and the apiserver answered lately."""
        return self.api.store.ready() and self.api.tokens.ready()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until `ready()` (True) or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """API first (no new requests), then controllers and the Lease, then informers and metrics."""
        log.info("manager stopping")
        self.api_server.stop()
        self.controllers.stop(timeout=30)
        self.reconcilers.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.client.close()
        log.info("manager stopped")


def run_manager(options: ManagerOptions, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns the exit code."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    manager = Manager(options).start()
    try:
        stop.wait()
    finally:
        manager.stop()
    return 0


def shard_ca_problem(path: str) -> str | None:
    """Why `path` cannot be the shard CA bundle (missing, unreadable, no PEM certificate), or None."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        return f"cannot read the file ({type(exc).__name__})"
    if "-----BEGIN CERTIFICATE-----" not in text:
        return "the file holds no PEM certificate"
    return None


def main_from_args(
    config_path: str,
    kubeconfig: str | None,
    namespace: str | None,
    api_port: int,
    metrics_port: int,
    admin_host_override: str | None,
    shard_ca_file: str | None = None,
) -> int:
    configure_logging()
    config = load_install_config_file(config_path)
    env = SETTINGS.env
    options = ManagerOptions(
        config=config,
        namespace=namespace or os.environ.get(env.pod_namespace) or config.namespace,
        kubeconfig=kubeconfig,
        api_port=api_port,
        metrics_port=metrics_port,
        tls_cert=os.environ.get(env.tls_cert, ManagerOptions.tls_cert),
        tls_key=os.environ.get(env.tls_key, ManagerOptions.tls_key),
        identity=os.environ.get(env.pod_name) or f"{socket.gethostname()}-{os.getpid()}",
        admin_host_override=admin_host_override,
        shard_ca_file=shard_ca_file,
    )
    if not Path(options.tls_cert).is_file():
        log.error("TLS certificate not found", extra={"path": options.tls_cert})
        return 2
    if shard_ca_file is not None and (problem := shard_ca_problem(shard_ca_file)) is not None:
        # At startup, not as every verify-ca/-full shard turning Unreachable (tls_failed) later.
        log.error(f"--shard-ca-file ({SETTINGS.env.shard_ca}): {problem}", extra={"path": shard_ca_file})
        return 2
    return run_manager(options)
