"""A status written back from the parsed object: exactly as stored when nothing changed, changes typed, and
the keys a newer release wrote kept; the cheap typed read of a Database for the fleet gauges."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from domain.constants import Phase
from domain.objects import DatabaseGlance, DatabaseObject, ShardObject, ShardState
from tests.support.objects import STORED_STATUS


def database(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "team-a-orders",
            "namespace": "dbprovider",
            "generation": 3,
            "resourceVersion": "812",
            "creationTimestamp": "2026-12-01T09:59:58Z",
        },
        "spec": {"consumer": "team-a", "externalId": "orders"},
        "status": STORED_STATUS,
    }
    return {**obj, **changes}


# A newer release's status: a phase this release does not know, and a key its model does not have.
NEWER_STATUS: dict[str, Any] = {**STORED_STATUS, "phase": "Sleeping", "placementScore": 7}


def test_an_unchanged_status_writes_back_exactly_as_stored_and_a_newer_releases_keys_stay() -> None:
    stored = {**STORED_STATUS, "placementScore": 7}  # a key this release's model does not know
    db = DatabaseObject.parse(database(status=stored))
    assert db.status_body() == stored and db.stored_status == stored
    moved = db.with_status(phase=Phase.DELETING)
    assert moved.status_body() == {**stored, "phase": "Deleting"} and db.status.phase == Phase.READY


def test_a_status_that_does_not_validate_is_written_anew_keeping_the_keys_it_does_not_know() -> None:
    db, valid = DatabaseObject.parse_lenient_status(database(status=NEWER_STATUS))
    assert not valid and db.status_body() == {"placementScore": 7}  # what it knows it writes anew
    db, valid = DatabaseObject.parse_lenient_status(database(status="garbage"))
    assert not valid and db.status_body() == {}


def test_a_condition_that_does_not_change_leaves_the_object_as_it_is() -> None:
    db = DatabaseObject.parse(database()).with_condition("Ready", True, "Provisioned", "")  # now for generation 3
    ready = db.status.conditions[0]
    assert ready.observed_generation == 3 and ready.last_transition_time.isoformat() == "2026-12-01T10:00:00+00:00"
    assert db.with_condition("Ready", True, "Provisioned", "") is db
    failed = db.with_condition("Ready", False, "DropFailed", "drop failed: timeout")
    assert failed.status.conditions[0].last_transition_time != ready.last_transition_time
    assert failed.status.conditions[0].observed_generation == 3  # the object's generation
    with pytest.raises(TypeError):
        db.with_status(phse="Ready")  # a misspelt field is refused, not pruned silently


def test_the_metadata_and_status_alone_parse_whatever_the_spec() -> None:
    obj = {"metadata": {"name": "shard-a", "generation": 2}, "spec": {"maxDatabases": "many"}, "status": None}
    shard = ShardState.parse(obj)
    assert (shard.name, shard.metadata.generation, shard.status_body()) == ("shard-a", 2, {})
    with pytest.raises(ValidationError):
        ShardObject.parse(obj)


def test_a_glance_at_a_database_reads_what_the_gauges_need_and_tolerates_odd_values() -> None:
    glance = DatabaseGlance.of(database())
    assert (glance.shard, glance.phase, glance.creation_timestamp) == ("shard-a", "Ready", "2026-12-01T09:59:58Z")
    assert glance.is_true("Ready") and glance.reason("Ready") == "Provisioned" and not glance.is_true("DeletionHeld")
    for odd in ({}, {"status": "x", "metadata": None}, {"status": {"shard": 7, "conditions": ["Ready", {"type": 1}]}}):
        glance = DatabaseGlance.of(odd)
        assert (glance.shard, glance.phase, glance.creation_timestamp) == (None, None, None)
        assert not glance.is_true("Ready") and glance.reason("Ready") is None
