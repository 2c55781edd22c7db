"""Tenants made before ownership records existed, met by this release on PostgreSQL 15, 16 and 18.

A Ready database made by such a build has a tenant role without a comment, and its Database has no
OwnershipRecorded condition (0.1.0 did not write one either). On the first pass of this release the
provider adopts its own tenant once (record, Event, log line) or, for a role that is not its work,
reports it and changes nothing on the shard; either way the database keeps working and its phase.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from domain.resources import DATABASES
from harness import PostgresServer
from informers import Rest
from reconciler.sql.tenant import OwnerRecord
from tests.reconciler.conftest import NAMESPACE, Fleet, condition, event_reasons, wait_events
from tests.support.common import wait_for
from tests.support.postgres import role_comment


def _as_superuser(postgres: PostgresServer, statement: str, role: str) -> None:
    with postgres.superuser_connection() as su:
        su.execute(sql.SQL(statement).format(sql.Identifier(role)))


def _made_before_records(admin_rest: Rest, postgres: PostgresServer, db: dict[str, Any]) -> None:
    """Turn a Ready database into one a build before ownership records left: no comment on its role,
    no OwnershipRecorded condition in its status."""
    _as_superuser(postgres, "COMMENT ON ROLE {} IS NULL", db["status"]["tenantName"])
    kept = [c for c in db["status"]["conditions"] if c["type"] != "OwnershipRecorded"]
    admin_rest.patch(
        DATABASES, db["metadata"]["name"], {"status": {"conditions": kept}}, NAMESPACE, subresource="status"
    )


def _ready_database(fleet: Fleet, postgres: PostgresServer, start_manager) -> tuple[Any, str, dict[str, Any]]:
    manager = start_manager()
    fleet.wait_shard(fleet.shard(postgres), "Ok")
    name = fleet.database(f"legacy-{fleet.suffix}")
    db = fleet.wait_phase(name, "Ready")
    recorded = condition(db, "OwnershipRecorded")
    assert recorded is not None and (recorded["status"], recorded["reason"]) == ("True", "Recorded")
    manager.stop()
    return manager, name, db


def _logs_in(fleet: Fleet, postgres: PostgresServer, name: str) -> bool:
    creds = fleet.credentials(name)
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        return conn.execute("SELECT current_user").fetchone()[0] == creds["user"]


def test_a_ready_tenant_made_before_records_is_adopted_once_with_an_event(
    fleet: Fleet, postgres: PostgresServer, admin_rest: Rest, start_manager
) -> None:
    _, name, db = _ready_database(fleet, postgres, start_manager)
    _made_before_records(admin_rest, postgres, db)

    upgraded = start_manager()  # the upgrade: this release leads and meets the database for the first time
    adopted = fleet.wait_database(
        name, lambda d: (condition(d, "OwnershipRecorded") or {}).get("reason") == "Adopted", what="adoption"
    )
    tenant = db["status"]["tenantName"]
    assert OwnerRecord.parse(role_comment(postgres, tenant)) == OwnerRecord(
        db["spec"]["consumer"], db["metadata"]["uid"]
    )
    wait_events(admin_rest, name, {"TenantAdopted"})
    assert adopted["status"]["phase"] == "Ready" and condition(adopted, "Ready")["status"] == "True"
    assert _logs_in(fleet, postgres, name)

    # Once: the next leader reads nothing again and says nothing again.
    first = condition(adopted, "OwnershipRecorded")
    upgraded.stop()
    start_manager()
    wait_for(
        lambda: len([e for e in _events(admin_rest, name) if e["reason"] == "TenantAdopted"]) == 1,
        what="exactly one TenantAdopted event",
    )
    assert condition(fleet.get_database(name), "OwnershipRecorded") == first


def _events(rest: Rest, name: str) -> list[dict[str, Any]]:
    items = rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def test_a_role_that_is_not_the_providers_work_is_reported_and_left_alone(
    fleet: Fleet, postgres: PostgresServer, admin_rest: Rest, start_manager
) -> None:
    _, name, db = _ready_database(fleet, postgres, start_manager)
    _made_before_records(admin_rest, postgres, db)
    tenant = db["status"]["tenantName"]
    _as_superuser(postgres, "ALTER ROLE {} CREATEDB", tenant)  # not how the provider makes roles

    start_manager()
    refused = fleet.wait_database(
        name, lambda d: (condition(d, "OwnershipRecorded") or {}).get("reason") == "ForeignRole", what="refusal"
    )
    recorded = condition(refused, "OwnershipRecorded")
    assert recorded["status"] == "False" and "createdb" in recorded["message"]
    assert refused["status"]["phase"] == "Ready" and condition(refused, "Ready")["status"] == "True"
    wait_events(admin_rest, name, {"ForeignRole"})
    assert role_comment(postgres, tenant) is None  # nothing written to the shard
    assert _logs_in(fleet, postgres, name)
    assert "TenantAdopted" not in event_reasons(admin_rest, name)

    # Fixed by a person (the attribute removed): the next pass adopts it.
    _as_superuser(postgres, "ALTER ROLE {} NOCREATEDB", tenant)
    admin_rest.patch(DATABASES, name, {"metadata": {"labels": {"touched": "1"}}}, NAMESPACE)
    fleet.wait_database(
        name, lambda d: (condition(d, "OwnershipRecorded") or {}).get("reason") == "Adopted", what="adoption"
    )
    assert _logs_in(fleet, postgres, name)
