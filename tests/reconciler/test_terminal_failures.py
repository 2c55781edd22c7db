"""Terminal SQL failures are not retried with backoff; retryable ones are; both say which in the metric.

A failure retrying cannot fix (a foreign object holds the tenant's name) is recorded with its reason
and counted with retryable="false": the key waits for the next change of its Database or Shard (or
one slow requeue after 5 minutes) instead of retrying every few seconds as if the shard timed out.
Work on a shard that is down waits for it (reason ShardNotReady) without spending retries, and goes on
as soon as the Shard is Ready again. Real kube-apiserver and PostgreSQL 18; the statement log and the
shard's health checks in it are the clock that shows nothing was retried meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from psycopg import sql

from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from reconciler.runtime import WorkQueue
from tests.reconciler.causes import foreign_database, retry_now, tenant_of, wait_reason
from tests.reconciler.conftest import NAMESPACE, Fleet, is_shard_check, provisioner_statements, tenant_sql
from tests.support.common import condition, wait_for
from tests.support.in_process_manager import InProcessManager
from tests.support.postgres import drop_as_superuser

NOW = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def database_queue(manager: InProcessManager) -> WorkQueue:
    (controller,) = [c for c in manager.manager.controllers if c.name == "database"]
    return controller.queue


def shard_checks(server: PostgresServer) -> int:
    return sum(1 for s in provisioner_statements(server) if is_shard_check(s))


def touch_shard(fleet: Fleet, shard: str) -> None:
    """A change of the Shard's spec: the Database controller enqueues the shard's databases."""
    spec = fleet.get_shard(shard)["spec"]
    fleet.rest.patch(SHARDS, shard, {"spec": {"maxDatabases": spec["maxDatabases"] + 1}})


@contextmanager
def foreign_role(server: PostgresServer, name: str) -> Iterator[None]:
    """A role of the tenant's name that the provisioner did not create (name_taken)."""
    with server.superuser_connection() as su:
        su.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    try:
        yield
    finally:
        drop_as_superuser(server, name)


@pytest.mark.parametrize(
    ("cause", "message", "fix_trigger"),
    [
        pytest.param(
            foreign_database,
            "create failed: name_taken (a database of this name exists and is not owned by the tenant role)",
            "shard",
            id="name-taken-then-shard-change",
        ),
        pytest.param(
            foreign_role,
            "create failed: name_taken (a role of this name exists that the provider did not make: the provisioner "
            "does not hold ADMIN on the role, so it did not create it)",
            "database",
            id="foreign-role-then-db-change",
        ),
    ],
)
def test_a_terminal_failure_waits_for_a_change_then_converges(
    logged_pg, fleet, start_manager, admin_rest, cause: Callable, message: str, fix_trigger: str
):
    shard = fleet.shard(logged_pg)
    # Ready before the manager starts: the first pass places at once (no ShardsUnavailable requeue,
    # whose 30 s would hide the terminal failure's own requeue).
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "test", "lastTransitionTime": NOW}
    status = {"conditions": [ready], "connectionBudget": 1000}
    admin_rest.patch(SHARDS, shard, {"status": status}, subresource="status")
    name = fleet.database(f"terminal-{fix_trigger}")
    tenant = tenant_of(admin_rest, name)
    try:
        converges_after_a_change(logged_pg, fleet, start_manager, admin_rest, shard, name, cause, message, fix_trigger)
    finally:
        drop_as_superuser(logged_pg, tenant)


def converges_after_a_change(
    logged_pg, fleet, start_manager, admin_rest, shard: str, name: str, cause: Callable, message: str, fix_trigger: str
) -> None:
    key = f"{NAMESPACE}/{name}"
    tenant = tenant_of(admin_rest, name)
    with cause(logged_pg, tenant):
        manager = start_manager()
        db = wait_reason(fleet, name, "EnsureFailed")
        assert condition(db, "Ready")["message"] == message  # the documented reason, the sanitized class
        assert db["status"]["phase"] == "Provisioning"
        queue = database_queue(manager)
        # Five minutes, not the 1 s of a first backoff step. A pass woken by an earlier write's event (the
        # credentials Secret's) may first ask for a short requeue while the cache lags the failure's own
        # status write (reconciler.database.writes.CacheLags); the slow requeue follows once it caught up.
        wait_for(lambda: (queue.due_in(key) or 0) > 200, what="the slow requeue of the terminal failure")
        assert queue.num_requeues(key) == 0  # no backoff counted
        assert manager.errors("database", "EnsureFailed", retryable="false") >= 1
        assert manager.errors("database", "EnsureFailed", retryable="true") == 0

        # Positive signal of time passing: the Shard controller checks the shard every 2 s, and a
        # backoff would have retried after 1, 2 and 4 s. One check to let the pass woken by the
        # failure's own status write finish, then four more: no further attempt, no SQL about it.
        start = shard_checks(logged_pg)
        wait_for(lambda: shard_checks(logged_pg) >= start + 1, what="a shard check")
        failures = manager.errors("database", "EnsureFailed")
        statements = len(tenant_sql(provisioner_statements(logged_pg)))
        wait_for(lambda: shard_checks(logged_pg) >= start + 5, timeout=60, what="four more shard checks")
        assert manager.errors("database", "EnsureFailed") == failures
        assert len(tenant_sql(provisioner_statements(logged_pg))) == statements
        assert fleet.get_database(name)["status"]["phase"] == "Provisioning"

    # The cause is gone; a change of the Shard or of the Database brings the key back at once.
    if fix_trigger == "shard":
        touch_shard(fleet, shard)
    else:
        retry_now(admin_rest, name)
    db = fleet.wait_phase(name, "Ready", timeout=60)
    assert condition(db, "Ready")["reason"] == "Provisioned"
    assert manager.errors("database", "EnsureFailed") == failures  # converged on the first pass
    assert manager.errors("database", "EnsureFailed", retryable="true") == 0


def test_work_on_a_shard_that_is_down_waits_without_spending_retries(fleet, start_manager, admin_rest):
    with PostgresServer("18", durable=True) as server:  # killed below
        shard = fleet.shard(server)
        manager = start_manager()
        name = fleet.database("shard-down")
        key = f"{NAMESPACE}/{name}"
        fleet.wait_phase(name, "Ready")

        server.kill()
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        admin_rest.patch(
            DATABASES, name, {"metadata": {"annotations": {ANNOTATION_ROTATE_REQUESTED_AT: stamp}}}, NAMESPACE
        )
        # Once the Shard says it is not Ready, the rotation waits for it: the reason says so, and
        # neither errors nor backoff grow (a shard that is back is used at once, not minutes later).
        db = wait_reason(fleet, name, "ShardNotReady")
        # "(Unreachable)" from the Shard's status, or "(Unreachable: it stopped answering)" when the Shard
        # check cut the rotation's session first: both say why it waits.
        assert condition(db, "Ready")["message"].startswith(f"shard {shard} is not Ready (Unreachable")
        assert db["status"]["phase"] == "Ready"
        fleet.wait_shard(shard, "Unreachable")
        queue = database_queue(manager)
        wait_for(lambda: (due := queue.due_in(key)) is not None and due > 20, what="the 30 s look of a wait")
        errors, requeues = manager.errors("database", "AdminUnavailable"), queue.num_requeues(key)
        time.sleep(6)  # longer than a shard re-check (5 s) and the first backoff steps: nothing retried
        assert (manager.errors("database", "AdminUnavailable"), queue.num_requeues(key)) == (errors, requeues)
        assert manager.errors("database", "ShardNotReady") == 0  # waiting is no failure
        assert condition(fleet.get_database(name), "Ready")["reason"] == "ShardNotReady"

        server.restart()  # the shard is back: the rotation is applied without anyone touching anything
        fleet.wait_shard(shard, "Ok", timeout=60)
        ready = time.monotonic()
        db = fleet.wait_database(name, lambda d: d["status"].get("rotationApplied") == stamp, timeout=90)
        assert time.monotonic() - ready < 15  # the Shard turning Ready wakes it, not its 30 s requeue
        assert condition(db, "Ready")["status"] == "True"
