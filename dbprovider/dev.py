"""`dbprovider dev`: the whole local stack on embedded defaults, torn down on Ctrl-C or SIGTERM."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path

from harness import KubeControlPlane, MissingBinaryError, PostgresServer

RELEASE_NAMESPACE = "dbprovider"


def _write_env_file(path: Path, values: dict[str, str]) -> None:
    """A shell-sourceable file; 0600 because it carries the local shard's password."""
    path.write_text("".join(f"export {key}={shlex.quote(value)}\n" for key, value in values.items()))
    path.chmod(0o600)


def run_dev(postgres_flavor: str, state_dir: str) -> int:
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())

    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    try:
        kube = KubeControlPlane()
    except MissingBinaryError as exc:
        print(f"dbprovider dev: {exc}", file=sys.stderr)
        return 2
    postgres: PostgresServer | None = None
    try:
        print("dbprovider dev: starting etcd and kube-apiserver ...", flush=True)
        kube.start()
        kube.ensure_namespace(RELEASE_NAMESPACE)
        print(f"dbprovider dev: starting PostgreSQL {postgres_flavor} ...", flush=True)
        postgres = PostgresServer(postgres_flavor).start()
        kubeconfig = kube.write_kubeconfig(state / "kubeconfig")
        env_file = state / "env"
        _write_env_file(
            env_file,
            {
                "KUBECONFIG": str(kubeconfig),
                "DBPROVIDER_SHARD_HOST": "127.0.0.1",
                "DBPROVIDER_SHARD_PORT": str(postgres.port),
                "DBPROVIDER_SHARD_USER": postgres.PROVISIONER,
                "DBPROVIDER_SHARD_PASSWORD": postgres.provisioner_password,
            },
        )
        print(
            "\n".join(
                [
                    "",
                    "dbprovider dev: ready",
                    f"  kube-apiserver {kube.url} (release namespace {RELEASE_NAMESPACE})",
                    f"  PostgreSQL {postgres.major} shard on 127.0.0.1:{postgres.port}, admin role "
                    f"{postgres.PROVISIONER}",
                    f"  env file: {env_file}",
                    "",
                    "In another shell:",
                    f"  source {env_file}",
                    "  kubectl get namespaces            # if kubectl is installed",
                    '  PGPASSWORD="$DBPROVIDER_SHARD_PASSWORD" psql -h 127.0.0.1 -p "$DBPROVIDER_SHARD_PORT" '
                    '-U "$DBPROVIDER_SHARD_USER" postgres',
                    "",
                    "Ctrl-C stops everything.",
                ]
            ),
            flush=True,
        )
        stopping.wait()
        print("dbprovider dev: stopping ...", flush=True)
    finally:
        if postgres is not None:
            postgres.close()
        kube.close()
        (state / "env").unlink(missing_ok=True)
    print("dbprovider dev: stopped", flush=True)
    return 0
