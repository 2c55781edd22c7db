"""A `dbprovider manager` process SIGKILLed during a move: the next replica takes the move up where the
status says it stood and completes it, with the tenant's client writing throughout.

The provider runs as the real manager command (tests/support/replica.py) against its own install on
the shared apiserver: the source Shard is the install's, the target a second Shard; both servers are
prepared for online moves. Killed, the manager closes no session and gives back no Lease: the next
replica waits for the Lease to run out (15 s), then finishes.

Killed during an offline copy (which showed its progress), the manager takes its pg_dump and
pg_restore along (outside a pod no container would end them), and the next replica copies again and
completes the move.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException

from dbprovider.devstack import DevStack
from domain.constants import API_VERSION
from domain.naming import database_object_name
from domain.resources import DATABASE_MOVES, DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from informers import SECRETS, Rest
from tests.reconciler.test_move import (
    Client,
    create_orders,
    every_row_moved,
    held_open,
    move_servers,
    waiting_for_slot,
)
from tests.support.common import b64, decoded, wait_for
from tests.support.devstack import install_stack, remove_stack
from tests.support.replica import ManagerReplica

pytestmark = pytest.mark.server

RELEASE = "mvkill"
TARGET = "mvkill-target"
SECRETS_NAMESPACE = f"{RELEASE}-system-shards"
TAKEOVER = 120.0  # seconds for the next replica to lead (the killed one's Lease runs 15 s) and finish

__all__ = ["move_servers"]  # test_move's module fixture: two servers of this module's own


@pytest.fixture(scope="module")
def stack(
    kube: KubeControlPlane, move_servers: tuple[PostgresServer, PostgresServer], tmp_path_factory
) -> Iterator[DevStack]:
    """The install with its Shard on the source server, and a Shard on the target server that takes no
    new database. Client endpoints prefer TLS (the target's server streams from the source's)."""
    source_server, target_server = move_servers
    secret = f"{TARGET}-provisioner"
    created = install_stack(
        kube,
        source_server,
        tmp_path_factory.mktemp("mvkill"),
        RELEASE,
        softDelete={"retention": "0"},
        shardSecrets=[{"namespace": SECRETS_NAMESPACE, "name": secret}],
    )
    with kube.admin_client() as client:
        rest = Rest(client)
        rest.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": SECRETS_NAMESPACE},
                "data": {"user": b64(target_server.PROVISIONER), "password": b64(target_server.provisioner_password)},
            },
            SECRETS_NAMESPACE,
        )
        spec = rest.get(SHARDS, created.shard)["spec"]
        rest.patch(SHARDS, created.shard, {"spec": {"client": {"sslmode": "prefer"}}})
        spec["admin"].update(port=target_server.port, secretRef={"namespace": SECRETS_NAMESPACE, "name": secret})
        spec["admin"]["serviceName"] = f"{TARGET}-primary"
        spec["client"].update(port=target_server.port, sslmode="prefer")
        spec["perconaCluster"] = {"namespace": created.namespace, "name": TARGET}
        spec["accepting"] = False
        rest.create(SHARDS, {"apiVersion": API_VERSION, "kind": "Shard", "metadata": {"name": TARGET}, "spec": spec})
        try:
            yield created
        finally:
            for name in (TARGET,):
                with contextlib.suppress(ApiException):
                    rest.delete(SHARDS, name)
                with contextlib.suppress(ApiException):
                    rest.patch(SHARDS, name, {"metadata": {"finalizers": None}})
            remove_stack(kube, created)


@contextlib.contextmanager
def replicas() -> Iterator[list[ManagerReplica]]:
    """Manager processes a test starts (appended to the list); every one killed afterwards."""
    started: list[ManagerReplica] = []
    try:
        yield started
    finally:
        for replica in started:
            if replica.proc.poll() is None:
                replica.kill()


def start(stack: DevStack, name: str, root: Path, pg_dump: Path, started: list[ManagerReplica]) -> ManagerReplica:
    replica = ManagerReplica(stack, name, root, env={"DBPROVIDER_PG_DUMP": str(pg_dump)})
    started.append(replica)
    replica.wait_ready()
    return replica


def phase_of(rest: Rest, namespace: str, name: str) -> str | None:
    return (rest.get(DATABASE_MOVES, name, namespace).get("status") or {}).get("phase")


def finished_by_the_next_replica(rest: Rest, namespace: str, name: str) -> None:
    """Waits for the move to complete (failing at once should it fail or be aborted)."""

    def completed() -> bool:
        now = phase_of(rest, namespace, name)
        assert now not in ("Failed", "Aborted"), rest.get(DATABASE_MOVES, name, namespace)
        return now == "Completed"

    wait_for(completed, TAKEOVER + 60, "the next replica to finish the move")


def ready_database(rest: Rest, stack: DevStack, external_id: str) -> tuple[str, dict[str, str]]:
    """A Database of the stack's consumer, Ready on the source; (its name, its credentials)."""
    name = database_object_name(stack.consumer, external_id)
    body = {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {"name": name, "namespace": stack.namespace},
        "spec": {"consumer": stack.consumer, "externalId": external_id},
    }
    rest.create(DATABASES, body, stack.namespace)
    wait_for(
        lambda: (rest.get(DATABASES, name, stack.namespace).get("status") or {}).get("phase") == "Ready",
        90,
        f"Database {name} Ready",
    )
    return name, decoded(rest.get(SECRETS, f"{name}-credentials", stack.namespace))


@pytest.mark.parametrize("phase", ["Copying", "CatchingUp"])
def test_a_manager_killed_during_a_move_is_replaced_and_the_move_completes_with_every_row(
    stack: DevStack, move_servers: tuple[PostgresServer, PostgresServer], tmp_path: Path, phase: str
) -> None:
    """Copying: killed while its statement making the replication slot waits on the source (a tenant
    transaction held open). CatchingUp: killed once the status says so, while a large table is copied."""
    source_server, target_server = move_servers
    pg_dump = target_server.bin_dir / "pg_dump"
    with stack.kube.admin_client() as client, replicas() as started:
        rest = Rest(client)
        first = start(stack, f"mvkill-{phase.lower()}-a", tmp_path, pg_dump, started)
        database, c = ready_database(rest, stack, f"kill-{phase.lower()}")
        holder = held_open(source_server, c) if phase == "Copying" else None
        create_orders(source_server, c, rows=0 if holder else 300_000)
        client_thread = Client(c)
        client_thread.start()
        move = f"kill-{phase.lower()}"
        body = {
            "apiVersion": API_VERSION,
            "kind": "DatabaseMove",
            "metadata": {"name": move, "namespace": stack.namespace},
            "spec": {"database": database, "target": TARGET},
        }
        try:
            wait_for(lambda: len(client_thread.acknowledged) >= 20, 30, "the client to write")
            rest.create(DATABASE_MOVES, body, stack.namespace)
            if holder is not None:
                waiting_for_slot(source_server)
            else:
                wait_for(lambda: phase_of(rest, stack.namespace, move) == phase, 120, f"the move in {phase}")
            first.kill()
            assert phase_of(rest, stack.namespace, move) == phase  # the kill landed in it
            if holder is not None:
                holder.commit()
                holder.close()

            start(stack, f"mvkill-{phase.lower()}-b", tmp_path, pg_dump, started)
            finished_by_the_next_replica(rest, stack.namespace, move)
        finally:
            client_thread.stop()
            if holder is not None and not holder.closed:
                holder.close()
            with contextlib.suppress(ApiException):
                rest.patch(DATABASE_MOVES, move, {"metadata": {"finalizers": None}}, stack.namespace)
                rest.delete(DATABASE_MOVES, move, stack.namespace)
        assert (rest.get(DATABASES, database, stack.namespace).get("status") or {}).get("shard") == TARGET
        every_row_moved(client_thread, move_servers, c)


def client_tools_of(pid: int) -> dict[int, str]:
    """The pg_dump and pg_restore processes whose parent is `pid`: {their pid: their start time}."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            comm, fields = stat
            if comm in ("pg_dump", "pg_restore") and fields[1] == str(pid):
                found[int(entry.name)] = fields[19]
    return found


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it: state, ppid, ... starttime at 19) of a process; None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def ended(pid: int, started: str) -> bool:
    """Whether that process is gone (or a zombie, or its pid now another process's)."""
    stat = _stat(pid)
    return stat is None or stat[1][0] in ("Z", "X") or stat[1][19] != started


def test_a_manager_killed_during_an_offline_copy_takes_its_client_tools_along_and_the_next_one_completes(
    stack: DevStack, move_servers: tuple[PostgresServer, PostgresServer], tmp_path: Path
) -> None:
    """The copy is held by a lock on the tenant's table (pg_dump waits for it, pg_restore for pg_dump):
    once the manager is SIGKILLed neither is left running, though the lock still holds."""
    source_server, target_server = move_servers
    pg_dump = target_server.bin_dir / "pg_dump"
    with stack.kube.admin_client() as client, replicas() as started:
        rest = Rest(client)
        first = start(stack, "mvkill-offline-a", tmp_path, pg_dump, started)
        database, c = ready_database(rest, stack, "kill-offline")
        create_orders(source_server, c, rows=1000)
        lock: psycopg.Connection = source_server.superuser_connection(c["database"])
        lock.autocommit = False
        lock.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        move = "kill-offline"
        body = {
            "apiVersion": API_VERSION,
            "kind": "DatabaseMove",
            "metadata": {"name": move, "namespace": stack.namespace},
            "spec": {"database": database, "target": TARGET, "mode": "Offline"},
        }
        try:
            rest.create(DATABASE_MOVES, body, stack.namespace)

            def copying() -> dict[int, str] | None:
                found = client_tools_of(first.proc.pid)
                return found if len(found) == 2 else None

            tools = wait_for(copying, 120, "the manager's pg_dump and pg_restore")
            # The copy's progress (every few seconds of it): the target's size so far, of the source's.
            mid = wait_for(
                lambda: (
                    (now := rest.get(DATABASE_MOVES, move, stack.namespace).get("status") or {}).get("targetBytes")
                    and now
                ),
                60,
                "the offline copy's progress",
            )
            assert mid["phase"] == "Copying" and mid["sourceBytes"] > 0 and "tablesTotal" not in mid
            assert mid["progress"] == f"{mid['targetBytes'] / 2**20:.0f} MiB of {mid['sourceBytes'] / 2**20:.0f} MiB"
            first.kill()
            assert phase_of(rest, stack.namespace, move) == "Copying"
            wait_for(
                lambda: all(ended(pid, since) for pid, since in tools.items()), 30, "the client tools to end with it"
            )
            lock.rollback()

            start(stack, "mvkill-offline-b", tmp_path, pg_dump, started)
            finished_by_the_next_replica(rest, stack.namespace, move)
        finally:
            lock.close()
            with contextlib.suppress(ApiException):
                rest.patch(DATABASE_MOVES, move, {"metadata": {"finalizers": None}}, stack.namespace)
                rest.delete(DATABASE_MOVES, move, stack.namespace)
        assert (rest.get(DATABASES, database, stack.namespace).get("status") or {}).get("shard") == TARGET
        rows = target_server.query("SELECT count(*) FROM orders", dbname=c["database"])
        assert rows == [(1000,)]
