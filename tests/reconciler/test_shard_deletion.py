"""Deleting a Shard that still holds databases is held by the Shard finalizer, whatever its status says:
a principal with `shards/status` access sets status.databaseCount to 0 and deletes the Shard; it stays
(deletionTimestamp set, finalizer held, condition DeletionHeld says why), its
database keeps working, and once the database is gone the Shard goes. A Shard made before the
finalizer existed gets it at its next check."""

from __future__ import annotations

from domain.constants import FINALIZER_SHARD_DATABASES
from domain.resources import SHARDS
from tests.reconciler.conftest import condition, install_config
from tests.support.common import wait_for
from tests.support.fleet import gone
from tests.support.logins import logs_in

PROTECTED = {"deletionProtection": {"enabled": True}}  # no admission policy is installed: the finalizer alone


def finalizers(fleet, name: str) -> list[str]:
    return fleet.get_shard(name)["metadata"].get("finalizers") or []


def test_a_shard_whose_status_lies_is_held_until_its_databases_are_gone(
    fleet, start_manager, admin_rest, postgres_pool
):
    postgres = postgres_pool.get("18")
    name = fleet.shard(postgres)  # made without the finalizer, as before it existed
    start_manager(install_config(**PROTECTED))
    wait_for(lambda: FINALIZER_SHARD_DATABASES in finalizers(fleet, name), 30, "the finalizer on the Shard")
    db = fleet.database(f"held-{postgres.major}")
    fleet.wait_phase(db, "Ready")

    admin_rest.patch(SHARDS, name, {"status": {"databaseCount": 0}}, subresource="status")  # the lie
    admin_rest.delete(SHARDS, name)

    def held() -> dict | None:
        shard = fleet.get_shard(name)
        found = condition(shard, "DeletionHeld")
        return shard if found is not None and found["status"] == "True" else None

    shard = wait_for(held, 30, "the Shard's deletion held")
    assert shard["metadata"].get("deletionTimestamp")
    assert FINALIZER_SHARD_DATABASES in shard["metadata"]["finalizers"]
    reported = condition(shard, "DeletionHeld")
    assert reported["reason"] == "DatabasesRemain" and "1 database(s)" in reported["message"]
    # Its database keeps working.
    assert logs_in(fleet.credentials(db)) is None
    assert condition(fleet.get_database(db), "Ready")["status"] == "True"

    fleet.request_delete(db)  # retention 0: dropped, then the object is removed
    wait_for(lambda: fleet.get_database(db) is None, 60, "the database gone")
    wait_for(lambda: gone(admin_rest, SHARDS, name), 30, "the Shard gone once its database is")


def test_without_deletion_protection_a_deleted_shard_is_not_held(fleet, start_manager, admin_rest, postgres_pool):
    postgres = postgres_pool.get("18")
    name = fleet.shard(postgres)
    manager = start_manager(install_config(**PROTECTED))
    wait_for(lambda: FINALIZER_SHARD_DATABASES in finalizers(fleet, name), 30, "the finalizer on the Shard")
    db = fleet.database(f"unheld-{postgres.major}")
    fleet.wait_phase(db, "Ready")
    manager.stop()

    start_manager()  # the suite's config: deletion protection off
    admin_rest.delete(SHARDS, name)
    wait_for(lambda: gone(admin_rest, SHARDS, name), 30, "the Shard gone although a database is placed there")
