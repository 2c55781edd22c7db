"""`dbprovider manager`: one replica of the provider.

The composition root: the only place that imports both `api` and `reconciler`. It builds the
shared informers, registers the controllers (run only while this replica holds the Lease) and the
consumer API (served by every replica), serves /metrics, and stops in order on SIGTERM.
"""

from __future__ import annotations

import copy
import logging
import os
import platform
import resource
import signal
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import prometheus_client
from kubernetes.client import ApiClient
from pydantic import ValidationError

from api import ApiServer, build_api
from api.server import DEFAULT_THREADS, FrontDoorOptions
from dbprovider.last_termination import LastTermination
from dbprovider.logs import configure_logging
from domain.admin_access import OutsidePod
from domain.config import InstallConfig, load_install_config, read_install_values
from domain.connection_budget import database_limit
from domain.resources import DATABASES, SHARDS
from domain.settings import SETTINGS
from domain.version import __version__
from informers.rest import Rest, throttle_credential_refresh
from reconciler.fleet_metrics import FleetCollector
from reconciler.runtime import ControllerManager, MetricsServer, start_metrics_server
from reconciler.setup import register_controllers

log = logging.getLogger(__name__)
CONNECTION_POOL_SIZE = 48  # one per watch plus the API's threads and the Shard and Consumer workers
# File descriptors kept free of API connections: watches and apiserver connections (CONNECTION_POOL_SIZE),
# shard sessions (about 5 per shard: its workers' sessions and the ping), metrics, log and TLS files.
FD_RESERVE = 1024


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
    pod_name: str | None = None  # the replica's own Pod (POD_NAME): its previous end is reported at start
    # --admin-host-override and --shard-ca-file; by default the Services and the bundle mounted from shardTLS.caBundle.
    outside_pod: OutsidePod = OutsidePod()
    api_threads: int = DEFAULT_THREADS
    # Tests shorten these (and the backoff cap, along with the alert rules' windows).
    lease_duration: float = SETTINGS.lease.duration
    renew_deadline: float = SETTINGS.lease.renew_deadline
    retry_period: float = SETTINGS.lease.retry_period
    shard_ping_interval: float = SETTINGS.shard_checks.ready_interval
    max_backoff: float | None = None  # the retry backoff cap; None = SETTINGS.retry.reconcile's
    quota_reservation_timeout: float = SETTINGS.quota.reservation_timeout


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
    throttle_credential_refresh(configuration)  # not before every request (informers.rest says why)
    client = ApiClient(configuration)
    if identity:
        client.user_agent = f"dbprovider/{identity}"
    return client


def register_build_info(registry: prometheus_client.CollectorRegistry) -> None:
    """`dbprovider_build_info{version, python} 1`: which release each replica runs (two versions at
    once during a rollout; `count by (version)` shows how far it got)."""
    build = prometheus_client.Info(
        "dbprovider_build", "The release this replica runs (and its Python).", registry=registry
    )
    build.info({"version": __version__, "python": platform.python_version()})


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
            outside_pod=options.outside_pod,
            shard_ping_interval=options.shard_ping_interval,
        )
        registry = self.controllers.metrics.registry
        informers = self.controllers.informers
        shards, databases = informers.informer(SHARDS), informers.informer(DATABASES, options.namespace)
        registry.register(
            FleetCollector(shards.list, databases.list, connection_limit=partial(database_limit, config=options.config))
        )
        register_build_info(registry)
        self.last_termination = LastTermination(Rest(self.client), registry, options.identity)
        self.api = build_api(
            options.config,
            informers,
            registry=registry,
            apiserver_reachable=self.controllers.apiserver_reachable,
            quota_timings=replace(SETTINGS.quota, reservation_timeout=options.quota_reservation_timeout),
        )
        self.api_server = ApiServer(
            self.api.app,
            options.api_host,
            options.api_port,
            options.tls_cert,
            options.tls_key,
            # deadlines and connection bounds: api.* keys
            options=FrontDoorOptions.from_config(options.config.api, threads=options.api_threads),
            registry=registry,
        )
        self.metrics_server: MetricsServer | None = None

    def start(self) -> Manager:
        self.metrics_server = start_metrics_server(
            self.options.metrics_port, self.controllers.metrics.registry, self.options.metrics_host
        )
        self.api_server.start()  # /healthz answers while the caches sync; /readyz waits for them
        self.controllers.start()
        if self.options.pod_name:  # why the previous container ended (OOMKilled...): one GET, beside the start
            threading.Thread(
                target=self.last_termination.report,
                args=(self.options.namespace, self.options.pod_name),
                name="last-termination",
                daemon=True,
            ).start()
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
        wait_for_stop(stop)
    finally:
        manager.stop()
    return 0


STOP_POLL = 0.5


def wait_for_stop(stop: threading.Event) -> None:
    """Block the main thread until `stop` is set, waking every STOP_POLL seconds.

    Python runs signal handlers in the main thread only, between bytecodes. A wait without a timeout
    relies on the signal interrupting the main thread's futex wait; the kernel may hand a process'
    signal to any of its threads, and when another one takes it the main thread sleeps on and the
    handler never runs (seen once in CI: `dbprovider dev` ignored SIGTERM for 150 s). Waking
    periodically lets the interpreter run a pending handler within STOP_POLL.
    """
    while not stop.wait(STOP_POLL):
        pass


def raise_fd_limit(max_connections: int) -> str | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit; why api.maxConnections does not fit, or None.

    A container starts with the runtime's soft limit (often 1024); API connections, watches and shard
    sessions all need descriptors, and a process out of them fails everywhere at once.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the file descriptor limit from %s to %s (%s)", soft, hard, type(exc).__name__)
    log.info("file descriptor limit %s", soft)
    if soft != resource.RLIM_INFINITY and max_connections + FD_RESERVE > soft:
        return (
            f"api.maxConnections {max_connections} leaves no room for watches, shard sessions and metrics under the "
            f"file descriptor limit of {soft} (it needs {FD_RESERVE} more): lower api.maxConnections to at most "
            f"{max(soft - FD_RESERVE, 0)} or raise the container's RLIMIT_NOFILE"
        )
    return None


def load_rendered_config(path: str) -> InstallConfig:
    """The install config as a release's render wrote it (the mounted ConfigMap).

    During a rolling update the ConfigMap is the newer release's while pods of this one still run,
    and one of them may restart: keys this release does not know are ignored with a warning (as an
    older reader ignores a Kubernetes object's newer fields), so it starts. Every other problem
    (a wrong value, a missing key) fails the start as before. `render` and `lint` stay strict.
    """
    data = read_install_values(path)
    if isinstance(data, dict):
        unknown = _unknown_keys(data)
        if unknown:
            log.warning(
                "install config keys this release does not know are ignored (a newer release rendered them?)",
                extra={"keys": [".".join(str(part) for part in loc) for loc in unknown]},
            )
            data = _without(data, unknown)
    return load_install_config(data)


def _unknown_keys(data: dict[str, Any]) -> list[tuple[str | int, ...]]:
    try:
        InstallConfig.model_validate(data)
    except ValidationError as exc:
        return [tuple(error["loc"]) for error in exc.errors(include_input=False) if error["type"] == "extra_forbidden"]
    return []


def _without(data: Any, paths: list[tuple[str | int, ...]]) -> Any:
    """A copy of `data` without the keys at `paths`."""
    data = copy.deepcopy(data)
    for path in paths:
        node = data
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1], None)
    return data


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
    outside_pod: OutsidePod,
    quota_reservation_timeout: float = SETTINGS.quota.reservation_timeout,
) -> int:
    configure_logging()
    config = load_rendered_config(config_path)
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
        pod_name=os.environ.get(env.pod_name) or None,
        outside_pod=outside_pod,
        quota_reservation_timeout=quota_reservation_timeout,
    )
    if not Path(options.tls_cert).is_file():
        log.error("TLS certificate not found", extra={"path": options.tls_cert})
        return 2
    if (problem := raise_fd_limit(config.api.max_connections)) is not None:
        log.error(problem)
        return 2
    ca_file = outside_pod.ca_file
    if ca_file is not None and (problem := shard_ca_problem(ca_file)) is not None:
        # At startup, not as every verify-ca/-full shard turning Unreachable (tls_failed) later.
        log.error(f"--shard-ca-file ({SETTINGS.env.shard_ca}): {problem}", extra={"path": ca_file})
        return 2
    return run_manager(options)
