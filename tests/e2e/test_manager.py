"""Two `dbprovider manager` processes on the real apiserver and PostgreSQL: the consumer flow over TLS,
leader election with failover, metrics, and logs that never carry a token, hash or password."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from dbprovider.devstack import DevStack
from dbprovider.manager import FD_RESERVE
from domain.naming import alternate_name
from domain.resources import CONSUMERS, SHARDS
from domain.settings import SETTINGS
from domain.tokens import hash_token
from domain.version import __version__
from harness import KubeControlPlane, PostgresServer
from harness.certs import CertificateAuthority
from harness.manager_endpoints import ManagerEndpoints
from informers import LEASES, Rest
from informers.leader import lease_holder
from tests.support.common import condition, shard_object, wait_for
from tests.support.devstack import install_stack
from tests.support.replica import REPO, ManagerReplica


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool, tmp_path_factory) -> Iterator[DevStack]:
    postgres: PostgresServer = postgres_pool.get("18")
    created = install_stack(kube, postgres, tmp_path_factory.mktemp("e2e"), "e2etest", softDelete={"retention": "0"})
    yield created
    with kube.admin_client() as client:
        rest = Rest(client)
        rest.delete(SHARDS, created.shard)
        rest.delete(CONSUMERS, created.consumer)


def _holder(kube: KubeControlPlane) -> str | None:
    with kube.admin_client() as client:
        try:
            lease = Rest(client).get(LEASES, "e2etest-manager", "e2etest-system")
        except Exception:  # noqa: BLE001
            return None
    return lease_holder(lease)


def test_two_replicas_serve_the_consumer_flow_and_fail_over(stack: DevStack, kube: KubeControlPlane, tmp_path):
    a, b = ManagerReplica(stack, "replica-a", tmp_path), ManagerReplica(stack, "replica-b", tmp_path)
    replicas = {"replica-a": a, "replica-b": b}
    try:
        a.wait_ready()
        b.wait_ready()
        leader_name = wait_for(lambda: _holder(kube), timeout=60, what="a lease holder")
        leader = replicas[leader_name]
        follower = b if leader is a else a

        # PUT on the follower: every replica serves the API, the leader reconciles.
        created = follower.call("PUT", "/v1/databases/orders", json={"sizeClass": "small"})
        assert created.status_code == 201, created.text
        view = wait_for(
            lambda: (r := leader.call("GET", "/v1/databases/orders").json())["phase"] == "Ready" and r,
            timeout=60,
            what="orders Ready",
        )
        assert view["sizeClass"] == "small"
        credentials = follower.call("GET", "/v1/databases/orders/credentials").json()
        with psycopg.connect(credentials["uri"]) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == credentials["user"]

        metrics = leader.metrics()
        assert 'dbprovider_databases{phase="Ready",reason="Provisioned",shard="e2etest-pg"} 1.0' in metrics
        assert 'dbprovider_shard_ready{reason="Ok",shard="e2etest-pg"} 1.0' in metrics
        assert "_created" not in metrics  # prometheus_client's *_created series are switched off
        assert 'route="/v1/databases/{externalId}"' in follower.metrics()
        assert "dbprovider_reconcile_conflicts_total" in metrics
        # Which release each replica runs (one version source: domain/version.py).
        build_info = f'dbprovider_build_info{{python="{platform.python_version()}",version="{__version__}"}} 1.0'
        assert build_info in metrics and build_info in follower.metrics()
        assert 'dbprovider_database_workers_in_flight{shard="e2etest-pg"} ' in metrics  # a gauge per shard
        assert "dbprovider_database_workers_per_shard 4.0" in metrics

        # The leader dies without a goodbye: the follower takes the Lease and reconciles.
        leader.kill()
        wait_for(lambda: _holder(kube) == follower.name, timeout=60, what="failover")
        assert follower.call("PUT", "/v1/databases/billing").status_code == 201
        wait_for(
            lambda: follower.call("GET", "/v1/databases/billing").json()["phase"] == "Ready",
            timeout=60,
            what="billing Ready",
        )

        # Soft delete through the API (retention 0 here): the database disappears.
        assert follower.call("DELETE", "/v1/databases/orders").status_code == 202
        wait_for(
            lambda: follower.call("GET", "/v1/databases/orders").status_code == 404, timeout=60, what="orders removed"
        )

        follower.stop()
        assert follower.exit_code == 0
        assert wait_for(lambda: _holder(kube) is None, timeout=10, what="lease released on SIGTERM")
    finally:
        for replica in replicas.values():
            replica.kill()

    token_hash = hash_token(stack.token)
    admin_password = stack.postgres.provisioner_password
    logs = a.log.read_text() + b.log.read_text()
    assert '"level": "info"' in logs  # structured JSON logs were written
    for secret in (stack.token, token_hash, admin_password, credentials["password"]):
        assert secret not in logs


def test_rotation_keeps_or_ends_the_sessions_of_the_old_password(stack: DevStack, tmp_path):
    """Through the API of a real manager: sessions survive a rotation unless terminateSessions is asked."""
    replica = ManagerReplica(stack, "replica-rot", tmp_path)
    try:
        replica.wait_ready()
        assert replica.call("PUT", "/v1/databases/rotating").status_code == 201
        wait_for(
            lambda: replica.call("GET", "/v1/databases/rotating").json()["phase"] == "Ready", timeout=60, what="Ready"
        )

        def rotate(**body) -> dict:
            asked = replica.call("POST", "/v1/databases/rotating/credentials/rotate", json=body or None)
            assert asked.status_code == 202, asked.text
            wait_for(
                lambda: not replica.call("GET", "/v1/databases/rotating").json()["rotationPending"],
                timeout=60,
                what="rotated",
            )
            return replica.call("GET", "/v1/databases/rotating/credentials").json()

        first = replica.call("GET", "/v1/databases/rotating/credentials").json()
        with psycopg.connect(first["uri"]) as kept:
            second = rotate()
            assert kept.execute("SELECT current_user").fetchone()[0] == first["user"]  # survived the rotation
            with psycopg.connect(second["uri"]) as ended:
                third = rotate(terminateSessions=True)
                for conn in (kept, ended):
                    with pytest.raises(psycopg.OperationalError):
                        conn.execute("SELECT 1")
        with psycopg.connect(third["uri"]) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == third["user"]
        assert replica.call("DELETE", "/v1/databases/rotating").status_code == 202
        wait_for(
            lambda: replica.call("GET", "/v1/databases/rotating").status_code == 404,
            timeout=60,
            what="rotating removed",
        )
    finally:
        replica.kill()
    logs = replica.log.read_text()
    for credentials in (first, second, third):
        assert credentials["password"] not in logs


def _logs_in(uri: str) -> bool:
    try:
        psycopg.connect(uri, connect_timeout=10).close()
    except psycopg.OperationalError:
        return False
    return True


def test_rotation_with_an_overlap_keeps_the_old_credentials_until_it_ends(stack: DevStack, tmp_path):
    """Through the API of a real manager: a rotation with an overlap hands out the other login role; the old
    credentials keep logging in until the overlap ends, across a manager restart, then stop."""
    overlap = 30
    first_replica = ManagerReplica(stack, "replica-overlap-a", tmp_path)
    second_replica = ManagerReplica(stack, "replica-overlap-b", tmp_path)
    try:
        first_replica.wait_ready()
        replica = first_replica
        assert replica.call("PUT", "/v1/databases/overlapping").status_code == 201
        wait_for(
            lambda: replica.call("GET", "/v1/databases/overlapping").json()["phase"] == "Ready",
            timeout=60,
            what="Ready",
        )
        before = replica.call("GET", "/v1/databases/overlapping/credentials").json()
        asked = replica.call("POST", "/v1/databases/overlapping/credentials/rotate", json={"overlapSeconds": overlap})
        assert asked.status_code == 202, asked.text
        wait_for(
            lambda: not replica.call("GET", "/v1/databases/overlapping").json()["rotationPending"],
            timeout=60,
            what="rotated",
        )
        after = replica.call("GET", "/v1/databases/overlapping/credentials").json()
        assert after["user"] == alternate_name(before["user"]) and after["database"] == before["database"]
        assert _logs_in(after["uri"]) and _logs_in(before["uri"])  # both, during the overlap

        # The manager goes away during the overlap; the next one ends it all the same.
        first_replica.kill()
        second_replica.wait_ready()
        replica = second_replica
        wait_for(lambda: not _logs_in(before["uri"]), timeout=overlap + 90, what="the old credentials refused")
        assert _logs_in(after["uri"])

        # Without an overlap the user stays the same and the old password stops at once.
        asked = replica.call("POST", "/v1/databases/overlapping/credentials/rotate", json={"overlapSeconds": 0})
        assert asked.status_code == 202, asked.text
        wait_for(
            lambda: not replica.call("GET", "/v1/databases/overlapping").json()["rotationPending"],
            timeout=60,
            what="rotated again",
        )
        last = replica.call("GET", "/v1/databases/overlapping/credentials").json()
        assert last["user"] == after["user"]
        assert _logs_in(last["uri"]) and not _logs_in(after["uri"])

        # The drop removes both login roles.
        assert replica.call("DELETE", "/v1/databases/overlapping").status_code == 202
        wait_for(
            lambda: replica.call("GET", "/v1/databases/overlapping").status_code == 404,
            timeout=60,
            what="overlapping removed",
        )
        with stack.postgres.superuser_connection() as conn:
            roles = conn.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname IN (%s, %s)", (before["user"], after["user"])
            ).fetchone()
        assert roles == (0,)
    finally:
        first_replica.kill()
        second_replica.kill()


# -- the shard CA bundle of a manager outside a pod (--shard-ca-file) -----------------------------


@pytest.fixture
def verified_shard(stack: DevStack, kube: KubeControlPlane) -> Iterator[str]:
    """A second Shard on the stack's server whose admin connection is verify-full (name: 127.0.0.1,
    through --admin-host-override): without a CA bundle the system trust store refuses the harness CA."""
    name = "e2etest-verified"
    admin = {
        "serviceName": f"{name}-primary",
        "port": stack.postgres.port,
        "sslmode": "verify-full",
        "secretRef": {"namespace": stack.shard_secrets_namespace, "name": stack.admin_secret},
    }
    spec = {
        "maxDatabases": 10,
        "accepting": False,  # the consumer tests above place nothing here
        "perconaCluster": {"namespace": stack.namespace, "name": name},
        "admin": admin,
        "client": {"host": "127.0.0.1", "port": stack.postgres.port, "sslmode": "require"},
    }
    body = shard_object(name, spec)
    with kube.admin_client() as client:
        Rest(client).create(SHARDS, body)
    yield name
    with kube.admin_client() as client:
        Rest(client).delete(SHARDS, name)


def _shard_ready(kube: KubeControlPlane, name: str) -> dict | None:
    with kube.admin_client() as client:
        return condition(Rest(client).get(SHARDS, name), "Ready")


def _shard_ready_under(replica: ManagerReplica, kube: KubeControlPlane, name: str, reason: str) -> dict:
    """The Shard's Ready condition once `replica`, the only manager running, reports `reason`; the replica
    then stops cleanly (SIGTERM releases the Lease for the next one)."""
    try:
        replica.wait_ready()
        return wait_for(
            lambda: (c := _shard_ready(kube, name)) and c["reason"] == reason and c,
            timeout=90,
            what=f"Shard {name} {reason}",
        )
    finally:
        replica.stop()
        assert replica.exit_code == 0


def test_a_manager_process_verifies_shards_with_its_shard_ca_file(
    stack: DevStack, kube: KubeControlPlane, verified_shard: str, tmp_path: Path
):
    right = ManagerReplica(stack, "replica-ca", tmp_path, ("--shard-ca-file", str(stack.postgres.ca_file)))
    assert _shard_ready_under(right, kube, verified_shard, "Ok")["status"] == "True"

    # The environment variable names the file too; a CA that signed nothing of the server's fails
    # verification, reported with the sanitized class only.
    other_ca = CertificateAuthority(tmp_path / "other-ca", "other").ca_file
    wrong = ManagerReplica(stack, "replica-wrong-ca", tmp_path, env={SETTINGS.env.shard_ca: str(other_ca)})
    ready = _shard_ready_under(wrong, kube, verified_shard, "Unreachable")
    assert (ready["status"], ready["message"]) == ("False", "check failed: tls_failed")


@pytest.mark.parametrize("content", [None, "not a certificate\n"], ids=["missing", "no-pem"])
def test_a_bad_shard_ca_file_stops_the_manager_at_startup(stack: DevStack, tmp_path: Path, content: str | None):
    path = tmp_path / "ca.crt"
    if content is not None:
        path.write_text(content)
    replica = ManagerReplica(stack, "replica-bad-ca", tmp_path, ("--shard-ca-file", str(path)))
    try:
        assert replica.proc.wait(timeout=60) == 2
    finally:
        replica.kill()
    assert "--shard-ca-file (DBPROVIDER_SHARD_CA_FILE)" in replica.log.read_text()


# -- the file descriptor limit: raised to the hard limit at start; a maxConnections without
# room for watches, shard sessions and metrics stops the manager, naming the key.


def start_limited(stack: DevStack, log: Path, soft: int, hard: int) -> tuple[subprocess.Popen[bytes], ManagerEndpoints]:
    """A manager whose RLIMIT_NOFILE starts at (soft, hard), as a container runtime would set it."""
    limits: Callable[[], None] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # noqa: E731
    endpoints = ManagerEndpoints()
    env = {**os.environ, **stack.manager_env(), "POD_NAME": f"fd-{log.stem}"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            stack.manager_argv(sys.executable, endpoints.api_port, endpoints.metrics_port),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            preexec_fn=limits,
        )
    return process, endpoints


def open_files_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open files limit")


def test_the_soft_limit_is_raised_to_the_hard_limit(stack: DevStack, tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    process, endpoints = start_limited(stack, tmp_path / "raised.log", 1024, hard)
    try:

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "raised.log").read_text()
            try:
                return requests.get(endpoints.url("/healthz"), verify=str(stack.ca_file), timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(ready, 60, "the manager to answer")
        assert open_files_limit(process.pid) == (str(hard), str(hard))
    finally:
        process.terminate()
        process.wait(60)


def test_max_connections_without_room_stops_the_manager(stack: DevStack, tmp_path: Path) -> None:
    limit = 1000 + FD_RESERVE - 1  # the default api.maxConnections (1000) does not fit
    process, _ = start_limited(stack, tmp_path / "refused.log", limit, limit)
    try:
        assert process.wait(timeout=60) == 2
    finally:
        process.kill()
    log = (tmp_path / "refused.log").read_text()
    assert "api.maxConnections 1000 leaves no room" in log
    assert f"at most {limit - FD_RESERVE}" in log
