"""A shard's capacity counts connections, against real servers with a small
max_connections: the Shard reports its budget, what is committed and how many more databases fit,
placement puts a database only where its size class's limit fits, a disabled tenant commits nothing
(its recovery waits for room and says so), a pooled shard overcommits by its declared ratio, and an
install config change that overcommits is reported, never applied to the tenants.

The test release's size classes: small 5, large 50, no class 10. The provider's own sessions on a
shard are 2 per Database worker of the shard (workersPerShard, 4) plus the check's: 9;
connectionBudget.reserved defaults to 5.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from domain.connection_budget import provider_sessions
from domain.constants import ANNOTATION_DELETE_REQUESTED_AT
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from tests.reconciler.conftest import NAMESPACE, condition, install_config, wait_events
from tests.support.common import wait_for

MAX_CONNECTIONS = 40
SUPERUSER_RESERVED = 3  # PostgreSQL's default
PROVIDER = provider_sessions(install_config().workers_per_shard)
RESERVED = 5  # connectionBudget.reserved's default


@pytest.fixture(scope="module", params=["18", "15"], ids=["pg18", "pg15"])
def small(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A server with max_connections 40; on 18 also reserved_connections 2 (a setting of 16 and later)."""
    settings = {"max_connections": str(MAX_CONNECTIONS)}
    if request.param == "18":
        settings["reserved_connections"] = "2"
    with PostgresServer(request.param, settings=settings) as server:
        yield server


def _expected_budget(server: PostgresServer, reserved: int = RESERVED) -> int:
    server_reserved = 2 if server.major >= 16 else 0
    return MAX_CONNECTIONS - SUPERUSER_RESERVED - server_reserved - PROVIDER - reserved


def _status(fleet, name: str) -> dict:
    return fleet.get_shard(name).get("status") or {}


def _wait_committed(fleet, name: str, committed: int) -> dict:
    return wait_for(
        lambda: (s := _status(fleet, name)).get("connectionsCommitted") == committed and s,
        timeout=30,
        what=f"{name} to commit {committed} connections",
    )


def test_the_shard_reads_its_budget_from_the_server(small, fleet, start_manager):
    name = fleet.shard(small)
    start_manager()

    status = _wait_committed(fleet, name, 0)

    assert status["connectionBudget"] == _expected_budget(small)
    budget_condition = condition(fleet.get_shard(name), "ConnectionBudgetExceeded")
    assert (budget_condition["status"], budget_condition["reason"]) == ("False", "Ok")


def test_placement_puts_a_database_only_where_its_limit_fits(small, fleet, start_manager):
    """Budget 23 on 15, 21 on 18: two databases of 10 fit; a third, one of 5 or one of 50 waits for capacity."""
    name = fleet.shard(small, max_databases=50)
    start_manager()
    fleet.wait_shard(name, "Ok")
    budget = _expected_budget(small)

    first = fleet.database(f"budget-a{small.major}")
    second = fleet.database(f"budget-b{small.major}")
    for db in (first, second):
        assert fleet.wait_phase(db, "Ready")["status"]["appliedConnectionLimit"] == 10
    _wait_committed(fleet, name, 20)

    assert 20 <= budget < 20 + 5  # the arithmetic the rest relies on
    third = fleet.database(f"budget-c{small.major}")
    small_one = fleet.database(f"budget-small{small.major}", size_class="small")
    large = fleet.database(f"budget-large{small.major}", size_class="large")
    for db in (third, small_one, large):
        failed = fleet.wait_reason(db, "Failed", "NoCapacity")
        assert not failed["status"].get("shard")
    assert "with room for 10 connections" in condition(fleet.get_database(third), "Ready")["message"]
    assert _status(fleet, name)["connectionsCommitted"] == 20
    assert len(fleet.get_shard(name)["status"]) and fleet.get_shard(name)["status"]["databaseCount"] == 2


def test_placement_prefers_the_shard_it_fits_over_the_emptier_one(small, postgres_pool, fleet, start_manager):
    roomy = fleet.shard(postgres_pool.get("18"), max_databases=50)  # max_connections 200
    tight = fleet.shard(small, max_databases=50)
    start_manager()
    fleet.wait_shard(tight, "Ok")
    fleet.wait_shard(roomy, "Ok")
    # Fill the roomy shard with more databases than the tight one will hold, so by count the tight
    # one is preferred...
    for i in range(2):
        db = fleet.database(f"roomy-{i}-{small.major}")
        assert fleet.wait_phase(db, "Ready")["status"]["shard"] in (roomy, tight)
    # ...but a large database (50) fits only the roomy one.
    large = fleet.database(f"pref-large{small.major}", size_class="large")
    assert fleet.wait_phase(large, "Ready")["status"]["shard"] == roomy


def test_an_install_config_that_overcommits_is_reported_not_applied(small, fleet, start_manager, caplog):
    name = fleet.shard(small, max_databases=50)
    manager = start_manager()
    dbs = [fleet.database(f"over-{i}-{small.major}") for i in range(2)]
    tenants = [fleet.wait_phase(db, "Ready")["status"]["tenantName"] for db in dbs]
    _wait_committed(fleet, name, 20)
    manager.stop()

    # Reserving more for other roles leaves less than the 20 connections already committed.
    caplog.set_level(logging.WARNING, logger="reconciler.shard.budget")
    tighter = _expected_budget(small, reserved=RESERVED + 10)
    start_manager(install_config(connectionBudget={"reserved": RESERVED + 10}))

    shard = wait_for(
        lambda: (
            (s := fleet.get_shard(name))
            and (c := condition(s, "ConnectionBudgetExceeded")) is not None
            and c["status"] == "True"
            and s
        ),
        timeout=30,
        what=f"{name} reported overcommitted",
    )
    exceeded = condition(shard, "ConnectionBudgetExceeded")
    assert exceeded["reason"] == "Overcommitted"
    assert f"commit 20 connections, more than the budget of {tighter}" in exceeded["message"]
    assert shard["status"]["connectionBudget"] == tighter
    assert condition(shard, "Ready")["status"] == "True"  # the shard itself is healthy
    assert any("shard connection budget exceeded" in r.getMessage() for r in caplog.records)
    # Nothing was changed on the tenants.
    limits = small.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = ANY(%s)", (tenants,))
    assert sorted(limits) == [(10,), (10,)]
    newcomer = fleet.database(f"over-new-{small.major}", size_class="small")
    fleet.wait_reason(newcomer, "Failed", "NoCapacity")


def test_a_dropped_database_no_longer_commits_its_connections(small, fleet, start_manager):
    """What a shard's databases commit follows their changes: a database dropped after its retention (its
    object then removed) gives its 10 connections back, on the running manager and after a restart."""
    name = fleet.shard(small, max_databases=50)
    manager = start_manager(install_config(softDelete={"retention": "4s"}))
    dbs = [fleet.database(f"drop-{i}-{small.major}") for i in range(2)]
    for db in dbs:
        fleet.wait_phase(db, "Ready")
    _wait_committed(fleet, name, 20)

    fleet.request_delete(dbs[0])
    wait_for(lambda: fleet.get_database(dbs[0]) is None, timeout=60, what="dropped after the window")
    _wait_committed(fleet, name, 10)

    manager.stop()  # a new manager sums the cache it lists anew
    start_manager(install_config(softDelete={"retention": "4s"}))
    newcomer = fleet.database(f"drop-new-{small.major}")
    fleet.wait_phase(newcomer, "Ready")
    _wait_committed(fleet, name, 20)


def test_a_disabled_tenant_commits_nothing_and_its_recovery_waits_for_room(small, fleet, start_manager, admin_rest):
    """A soft-deleted database gives its connections back while its tenant is disabled; removing the delete
    annotation when they were placed elsewhere meanwhile is reported (RecoveryOverBudget) and done once they
    fit again."""
    name = fleet.shard(small, max_databases=50)
    start_manager(install_config(softDelete={"retention": "1h"}))
    first, second = fleet.database(f"rec-a{small.major}"), fleet.database(f"rec-b{small.major}")
    tenant = fleet.wait_phase(first, "Ready")["status"]["tenantName"]
    fleet.wait_phase(second, "Ready")
    _wait_committed(fleet, name, 20)

    fleet.request_delete(first)
    status = _wait_committed(fleet, name, 10)  # disabled: no login, no connections committed
    assert status["databaseCount"] == 2  # it keeps its place until it is dropped
    third = fleet.database(f"rec-c{small.major}")
    fleet.wait_phase(third, "Ready")  # placed with the connections the disabled tenant gave back
    _wait_committed(fleet, name, 20)

    admin_rest.patch(DATABASES, first, {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: None}}}, NAMESPACE)
    waiting = fleet.wait_reason(first, "Deleting", "RecoveryOverBudget")
    message = condition(waiting, "Ready")["message"]
    assert f"commit 20 of its {_expected_budget(small)} connections" in message and "limit is 10" in message
    assert small.query("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (tenant,)) == [(False,)]
    wait_events(admin_rest, first, {"RecoveryOverBudget"})

    fleet.request_delete(third)  # its 10 connections come back: the waiting recovery goes ahead
    fleet.wait_phase(first, "Ready", timeout=90)
    assert small.query("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (tenant,)) == [(True,)]
    _wait_committed(fleet, name, 20)


def test_a_pooled_shard_overcommits_by_its_ratio_and_shows_what_fits(small, fleet, start_manager):
    """connectionBudget.overcommit multiplies the tenants' part of a named shard's budget; the Shard says how many
    more databases of the default limit (10) fit: by budget, by maxDatabases, none while it is drained."""
    name = fleet.shard(small, max_databases=50)
    start_manager(install_config(connectionBudget={"overcommit": {name: 2}}))
    pooled = 2 * _expected_budget(small)
    status = wait_for(
        lambda: (s := _status(fleet, name)).get("connectionBudget") == pooled and s, 30, "the overcommitted budget"
    )
    assert status["databasesAvailable"] == pooled // 10
    db = fleet.database(f"pooled-{small.major}")
    fleet.wait_phase(db, "Ready")
    wait_for(lambda: _status(fleet, name).get("databasesAvailable") == (pooled - 10) // 10, 30, "one fewer fits")

    fleet.rest.patch(SHARDS, name, {"spec": {"maxDatabases": 2}})
    wait_for(lambda: _status(fleet, name).get("databasesAvailable") == 1, 30, "maxDatabases bounds what fits")
    fleet.rest.patch(SHARDS, name, {"spec": {"accepting": False}})
    wait_for(lambda: _status(fleet, name).get("databasesAvailable") == 0, 30, "a drained shard takes none")
