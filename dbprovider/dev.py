"""`dbprovider dev`: the whole product locally on embedded defaults, torn down on Ctrl-C or SIGTERM.

A real kube-apiserver + etcd and a PostgreSQL shard on loopback, the install applied to them, a
Shard and a Consumer registered, and one manager replica (API, controllers, metrics) in this
process. Prints the consumer's token and the curl commands of the consumer flow, and writes a
shell env file (KUBECONFIG, DBPROVIDER_API_URL, DBPROVIDER_CA_FILE, DBPROVIDER_TOKEN).
"""

from __future__ import annotations

import logging
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from dbprovider.devstack import DevStack
from dbprovider.logs import configure_logging
from dbprovider.manager import Manager, ManagerOptions
from harness import KubeControlPlane, MissingBinaryError, PostgresServer


def _write_env_file(path: Path, values: dict[str, str]) -> None:
    """A shell-sourceable file; 0600 because it carries the consumer's token."""
    path.write_text("".join(f"export {key}={shlex.quote(value)}\n" for key, value in values.items()))
    path.chmod(0o600)


def _walkthrough(stack: DevStack, env_file: Path) -> str:
    auth = '-H "Authorization: Bearer $DBPROVIDER_TOKEN" --cacert "$DBPROVIDER_CA_FILE"'
    api = "$DBPROVIDER_API_URL/v1/databases"
    return "\n".join(
        [
            "",
            "dbprovider dev: ready",
            f"  consumer API  {stack.api_url}  (consumer {stack.consumer}, token {stack.token})",
            f"  metrics       http://127.0.0.1:{stack.metrics_port}/metrics",
            f"  kube-apiserver {stack.kube.url}  (namespace {stack.namespace})",
            f"  PostgreSQL {stack.postgres.major} shard {stack.shard} on 127.0.0.1:{stack.postgres.port}",
            f"  env file      {env_file}",
            "",
            "In another shell:",
            f"  source {env_file}",
            f"  curl -sS -X PUT {auth} -H 'Content-Type: application/json' -d '{{\"sizeClass\": \"small\"}}' "
            f"{api}/orders",
            f'  curl -sS {auth} {api}/orders                 # repeat until "phase": "Ready"',
            f"  curl -sS {auth} {api}/orders/credentials     # host, port, user, password, uri",
            f"  psql \"$(curl -sS {auth} {api}/orders/credentials | python3 -c 'import json,sys; "
            'print(json.load(sys.stdin)["uri"])\')"',
            f"  curl -sS -X DELETE {auth} {api}/orders       # soft delete: dropped after 2 minutes",
            "  kubectl get shards,consumers; kubectl -n dbprovider get databases   # if kubectl is installed",
            "",
            "Ctrl-C stops everything.",
        ]
    )


def run_dev(postgres_flavor: str, state_dir: str) -> int:
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
    postgres: PostgresServer | None = None
    manager: Manager | None = None
    env_file = state / "env"
    try:
        print("dbprovider dev: starting etcd and kube-apiserver ...", flush=True)
        kube.start()
        print(f"dbprovider dev: starting PostgreSQL {postgres_flavor} ...", flush=True)
        postgres = PostgresServer(postgres_flavor).start()
        print("dbprovider dev: installing the provider and registering the shard and a consumer ...", flush=True)
        stack = DevStack(kube, postgres, state).install()
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
            admin_host_override="127.0.0.1",
        )
        manager = Manager(options).start()
        _write_env_file(env_file, stack.env())
        print(_walkthrough(stack, env_file), flush=True)
        stopping.wait()
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
