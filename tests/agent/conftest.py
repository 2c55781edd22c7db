"""The agent suite's two clusters: the provider's (the session apiserver, a DevStack release and the real
manager as a process, PostgreSQL 18 as the shard) and a consumer cluster of its own (a second real
kube-apiserver) where `dbprovider agent` runs as a process, as its rendered ServiceAccount.

The shard's server is ready for online moves (wal_level=logical and its administrators' one-time grants)
and the install lists spare admin Secret slots, so a test can add a target Shard and move a claim's
database there.

The provider process listens on the stack's fixed port, so the test can kill it (the provider away)
and start it again where the agent looks for it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from dbprovider.devstack import DevStack
from domain.agent_config import load_agent_config
from domain.resources import CLAIMS, CONSUMERS
from harness import KubeControlPlane, PostgresServer
from harness.process import free_port
from informers import SECRETS, Rest
from infra.render import render_agent_manifests
from reconciler.move.tools import PG_DUMP_VARIABLE
from tests.sql.conftest import LogicalPool
from tests.sql.test_move_privileges import source_grant, target_grant
from tests.support.admin_secrets import shard_secrets
from tests.support.common import unique, wait_for
from tests.support.devstack import install_stack, remove_stack
from tests.support.kubeapi import KubeApi, apply_all
from tests.support.manager_process import ManagerProcess
from tests.support.postgres import PostgresPool

REPO = Path(__file__).resolve().parents[2]
AGENT_NAMESPACE = "dbprovider-agent"
POLL_SECONDS = 2
CONSUMER_QUOTA = 40


class Provider(ManagerProcess):
    """The provider's `dbprovider manager` on the stack's own ports (so it can come back on them)."""

    def __init__(self, stack: DevStack, log_dir: Path) -> None:
        self.stack, self.log_dir, self.starts = stack, log_dir, 0
        super().__init__("agent-provider", log_dir / "provider-0.log", str(stack.ca_file))
        self.api_port, self.metrics_port = stack.api_port, stack.metrics_port

    def start(self) -> Provider:
        self.log = self.log_dir / f"provider-{self.starts}.log"
        self.starts += 1
        # A move copies the schema with the shards' major's pg_dump (the harness' build, not the PATH's).
        tools = {PG_DUMP_VARIABLE: str(self.stack.postgres.bin_dir / "pg_dump")}
        self.spawn(self.stack.manager_argv(sys.executable), {**os.environ, **self.stack.manager_env(), **tools}, REPO)
        self.wait_ready()
        return self


@dataclass
class Consumer:
    """The consumer cluster: its apiserver, an admin client, the agent process and its token file."""

    kube: KubeControlPlane
    admin: Rest
    token_file: Path
    agent: subprocess.Popen[bytes]
    agent_log: Path
    endpoint: str  # the agent's http://127.0.0.1:<port> (/metrics, /healthz, /readyz)

    def claim(self, namespace: str, spec: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
        """A new DatabaseClaim (in a namespace created for it)."""
        self.kube.ensure_namespace(namespace)
        body = {
            "apiVersion": CLAIMS.api_version,
            "kind": "DatabaseClaim",
            "metadata": {"name": name or unique("claim"), "namespace": namespace},
            "spec": spec or {},
        }
        return self.admin.create(CLAIMS, body, namespace)

    def get_claim(self, claim: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.admin.get(CLAIMS, claim["metadata"]["name"], claim["metadata"]["namespace"])
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.admin.get(SECRETS, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def condition(self, claim: dict[str, Any], type_: str) -> dict[str, Any]:
        current = self.get_claim(claim) or {}
        conditions = (current.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), {})

    def wait_condition(self, claim: dict[str, Any], type_: str, status: str, timeout: float = 90) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            assert self.agent.poll() is None, f"the agent exited: {self.agent_log.read_text()[-3000:]}"
            found = self.condition(claim, type_)
            return found if found.get("status") == status else None

        return wait_for(reached, timeout, f"{claim['metadata']['name']}: {type_}={status}", max_interval=0.5)


@pytest.fixture(scope="package")
def logical_servers() -> Iterator[PostgresPool]:
    """The stack's shard's server, started with wal_level=logical (a move's source needs it)."""
    pool = PostgresPool(settings=LogicalPool.SETTINGS)
    yield pool
    pool.close()


def movable_server(pool: PostgresPool, major: str = "18") -> PostgresServer:
    """A server of `pool` given the one-time grants of online moves, as a source and as a target."""
    server = pool.get(major)
    source_grant(server)
    target_grant(server)
    return server


@pytest.fixture(scope="package")
def stack(
    kube: KubeControlPlane, logical_servers: PostgresPool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevStack]:
    # A release name of its own each time the package sets up (pytest-xdist may run its files apart).
    # A short retention: a deleted claim's database is dropped within the tests' patience (quota, recreation).
    workdir = tmp_path_factory.mktemp("agent-provider")
    release = unique("agent")
    created = install_stack(
        kube,
        movable_server(logical_servers),
        workdir,
        release,
        softDelete={"retention": "30s"},
        shardSecrets=shard_secrets(release, f"{release}-system-shards"),  # slots for the Shards a test adds
    )
    with kube.admin_client() as client:  # room for every Ready claim of the suite (the dev Consumer has 10)
        Rest(client).patch(CONSUMERS, created.consumer, {"spec": {"maxDatabases": CONSUMER_QUOTA}})
    yield created
    remove_stack(kube, created)


@pytest.fixture(scope="package")
def provider(stack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    process = Provider(stack, tmp_path_factory.mktemp("agent-provider-logs")).start()
    yield process
    process.stop()


@pytest.fixture(scope="package")
def consumer_kube() -> Iterator[KubeControlPlane]:
    """The consumer cluster's own kube-apiserver and etcd."""
    with KubeControlPlane() as control_plane:
        yield control_plane


@pytest.fixture(scope="package")
def consumer(
    consumer_kube: KubeControlPlane, stack: DevStack, provider: Provider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Consumer]:
    """The agent installed as `dbprovider render --agent` renders it, running as a process with its
    rendered ServiceAccount's token (so the RBAC is proven sufficient) and the consumer's token in a file."""
    workdir = tmp_path_factory.mktemp("agent-consumer")
    consumer_kube.ensure_namespace(AGENT_NAMESPACE)
    values = {"providerUrl": stack.api_url, "tokenSecret": "dbprovider-token", "namespace": AGENT_NAMESPACE}
    with consumer_kube.admin_client() as client:
        apply_all(KubeApi(client), render_agent_manifests(load_agent_config(values)))
    token_file = workdir / "token"
    token_file.write_text(stack.token + "\n")
    kubeconfig = consumer_kube.write_kubeconfig(
        workdir / "agent.kubeconfig", token=consumer_kube.service_account_token(AGENT_NAMESPACE, "dbprovider-agent")
    )
    log = workdir / "agent.log"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "dbprovider.cli",
        "agent",
        *("--provider-url", stack.api_url, "--token-file", str(token_file), "--ca-file", str(stack.ca_file)),
        *("--kubeconfig", str(kubeconfig), "--namespace", AGENT_NAMESPACE),
        *("--poll-interval", str(POLL_SECONDS), "--max-backoff", "3"),
        *("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAME": f"agent-{secrets.token_hex(3)}"},
            cwd=REPO,
            start_new_session=True,
        )
    with consumer_kube.admin_client() as admin_client:
        yield Consumer(consumer_kube, Rest(admin_client), token_file, process, log, f"http://127.0.0.1:{port}")
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
