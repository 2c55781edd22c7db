"""`dbprovider dev`: the whole product locally on embedded defaults, torn down on Ctrl-C or SIGTERM.

A real kube-apiserver + etcd and a PostgreSQL shard on loopback (`shard="patroni"`: a Patroni cluster of a
primary and a streaming replica behind a primary endpoint, with pgBouncer as the client endpoint, as
harness.patroni runs it), the install applied to them, a Shard and a Consumer registered, and one
manager replica (API, controllers, metrics) in this process. Prints the consumer's token and the curl
commands of the consumer flow, and writes a shell env file (KUBECONFIG, DBPROVIDER_API_URL,
DBPROVIDER_CA_FILE, DBPROVIDER_TOKEN).

`--config values.yaml` merges the user's install values onto dev's defaults (dbprovider.dev_values);
values that are invalid or cannot work locally are refused (exit 2, naming the key) before anything
starts or is written. With engines.cloudberry.enabled the Keldon DatabaseCluster CRD is installed
and an example DatabaseCluster + cloudberry Shard is written for the user to apply.
"""

from __future__ import annotations

import importlib.util
import logging
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dbprovider.dev_values import dev_install_config
from dbprovider.devstack import DevStack, dev_shard_capacity
from dbprovider.logs import configure_logging
from dbprovider.manager import Manager, ManagerOptions, wait_for_stop
from domain.admin_access import OutsidePod
from domain.config import format_duration
from harness import KubeControlPlane, MissingBinaryError, PostgresServer
from harness.patroni import PGBOUNCER, PatroniShard

DEV_READY_TIMEOUT = 60.0
SHARD_KINDS = ("postgres", "patroni")


def _missing_for(shard: str) -> str | None:
    """What the shard kind needs and this machine lacks (None: nothing)."""
    if shard == "patroni" and not PGBOUNCER.exists():
        return f"--shard patroni runs pgBouncer, and {PGBOUNCER} is missing (apt-get install pgbouncer)"
    if shard == "patroni" and importlib.util.find_spec("patroni") is None:
        return "--shard patroni runs Patroni, which is not installed (pip install -e '.[test]')"
    return None


def _write_env_file(path: Path, values: dict[str, str]) -> None:
    """A shell-sourceable file; 0600 because it carries the consumer's token."""
    path.write_text("".join(f"export {key}={shlex.quote(value)}\n" for key, value in values.items()))
    path.chmod(0o600)


def _cloudberry_walkthrough(stack: DevStack) -> list[str]:
    if not stack.config.engines.cloudberry.enabled:
        return []
    status = '\'{"status": {"phase": "Running"}}\''
    return [
        "",
        "Cloudberry (engines.cloudberry.enabled): the Keldon DatabaseCluster CRD is installed. Keldon cannot run",
        "here, so play the operator: declare a cluster and a Shard on it, then set the cluster's phase.",
        f"  kubectl apply -f {stack.cloudberry_example}",
        f"  kubectl -n {stack.namespace} patch dbc dev-cloudberry --subresource=status --type=merge -p {status}",
        "  kubectl get shard dev-cloudberry -w     # Ready follows the phase (ClusterNotRunning unless Running)",
        '  # then PUT with {"engine": "cloudberry"} places a database on it',
    ]


def _shard_line(stack: DevStack) -> str:
    server = stack.postgres
    if isinstance(server, PatroniShard):
        return (
            f"  PostgreSQL {server.major} Patroni shard {stack.shard}: primary 127.0.0.1:{server.port} (admin), "
            f"pgBouncer 127.0.0.1:{server.client_port} ({server.pool_mode} pooling, what consumers get)"
        )
    return f"  PostgreSQL {server.major} shard {stack.shard} on 127.0.0.1:{server.port}"


def _walkthrough(stack: DevStack, env_file: Path, elapsed: float) -> str:
    size_class = next(iter(stack.config.size_classes), None)
    body = f'-d \'{{"sizeClass": "{size_class}"}}\' ' if size_class else ""
    retention = format_duration(stack.config.soft_delete.retention)
    auth = '-H "Authorization: Bearer $DBPROVIDER_TOKEN" --cacert "$DBPROVIDER_CA_FILE"'
    api = "$DBPROVIDER_API_URL/v1/databases"
    return "\n".join(
        [
            "",
            f"dbprovider dev: ready in {elapsed:.1f}s",
            f"  consumer API  {stack.api_url}  (consumer {stack.consumer}, token {stack.token})",
            f"  metrics       http://127.0.0.1:{stack.metrics_port}/metrics",
            f"  kube-apiserver {stack.kube.url}  (namespace {stack.namespace})",
            _shard_line(stack),
            f"  env file      {env_file}",
            "",
            "In another shell:",
            f"  source {env_file}",
            f"  curl -sS -X PUT {auth} -H 'Content-Type: application/json' {body}{api}/orders",
            f'  curl -sS {auth} {api}/orders                 # repeat until "phase": "Ready"',
            f"  curl -sS {auth} {api}/orders/credentials     # host, port, user, password, uri",
            f"  psql \"$(curl -sS {auth} {api}/orders/credentials | python3 -c 'import json,sys; "
            'print(json.load(sys.stdin)["uri"])\')"',
            f"  curl -sS -X DELETE {auth} {api}/orders       # soft delete: dropped after {retention}",
            f"  kubectl get shards,consumers; kubectl -n {stack.namespace} get databases   # if kubectl is installed",
            *_cloudberry_walkthrough(stack),
            "",
            "Ctrl-C stops everything.",
        ]
    )


def run_dev(
    postgres_flavor: str, state_dir: str, overrides: Mapping[str, Any] | None = None, shard: str = "postgres"
) -> int:
    """`overrides`: the user's install values, already checked (dev_values.checked_dev_values); `shard`:
    one of SHARD_KINDS."""
    missing = _missing_for(shard)
    if missing is not None:
        print(f"dbprovider dev: {missing}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    configure_logging(logging.WARNING)

    state = Path(state_dir).resolve()
    shutil.rmtree(state, ignore_errors=True)  # a previous run's files point at servers that are gone
    state.mkdir(parents=True)
    state.chmod(0o700)
    try:
        kube = KubeControlPlane()
    except MissingBinaryError as exc:
        print(f"dbprovider dev: {exc}", file=sys.stderr)
        return 2
    postgres: PostgresServer | PatroniShard | None = None
    manager: Manager | None = None
    env_file = state / "env"
    started = time.monotonic()

    def progress(step: str) -> None:
        print(f"dbprovider dev: [{time.monotonic() - started:5.1f}s] {step}", flush=True)

    try:
        progress("starting etcd and kube-apiserver ...")
        kube.start()
        # The server's max_connections and the Shard's maxDatabases agree: MAX databases of the default
        # connection limit fit its connection budget.
        max_connections, max_databases = dev_shard_capacity(dev_install_config(overrides or {}))
        if shard == "patroni":
            progress(f"starting a Patroni cluster of PostgreSQL {postgres_flavor} and pgBouncer ...")
            postgres = PatroniShard(postgres_flavor, max_connections=max_connections).start()
        else:
            progress(f"starting PostgreSQL {postgres_flavor} ...")
            postgres = PostgresServer(postgres_flavor, settings={"max_connections": str(max_connections)}).start()
        progress("installing the provider and registering the shard and a consumer ...")
        stack = DevStack(
            kube, postgres, state, config_overrides=dict(overrides or {}), max_databases=max_databases
        ).install()
        options = ManagerOptions(
            config=stack.config,
            namespace=stack.namespace,
            kubeconfig=str(stack.manager_kubeconfig),
            api_host="127.0.0.1",
            api_port=stack.api_port,
            metrics_host="127.0.0.1",
            metrics_port=stack.metrics_port,
            tls_cert=str(stack.tls_cert),
            tls_key=str(stack.tls_key),
            identity="dbprovider-dev",
            outside_pod=OutsidePod(admin_host="127.0.0.1"),
        )
        progress("starting the manager (consumer API, controllers, metrics) ...")
        manager = Manager(options).start()
        # "ready" promises that the walkthrough works now: before the caches synced and the elector's
        # first Lease request answered, a PUT would get 503 (the apiserver counts as unreachable).
        if not manager.wait_ready(DEV_READY_TIMEOUT):
            print(f"dbprovider dev: the manager did not become ready within {DEV_READY_TIMEOUT:.0f}s", file=sys.stderr)
            return 1
        _write_env_file(env_file, stack.env())
        print(_walkthrough(stack, env_file, time.monotonic() - started), flush=True)
        wait_for_stop(stopping)
        print("dbprovider dev: stopping ...", flush=True)
    finally:
        began = time.monotonic()
        if manager is not None:
            manager.stop()
            print(f"dbprovider dev: manager stopped ({time.monotonic() - began:.1f}s)", flush=True)
        if postgres is not None:
            postgres.close()
        kube.close()
        env_file.unlink(missing_ok=True)
    print(f"dbprovider dev: stopped ({time.monotonic() - began:.1f}s)", flush=True)
    return 0
