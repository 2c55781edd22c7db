"""Objects parsed once at the boundary: metadata, spec and status typed, unknown fields ignored, and the
status dumped back exactly as stored (so an unchanged status writes nothing)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, API_VERSION, Phase
from domain.metadata import Identity, ObjectMeta
from domain.objects import ConsumerObject, DatabaseObject, ShardObject
from domain.resources import DATABASES, SHARDS, database_consumer, database_shard
from informers import Resource as InformersResource
from tests.support.objects import STORED_STATUS


def database(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {
            "name": "team-a-orders",
            "namespace": "dbprovider",
            "uid": "0d6b-uid",
            "generation": 3,
            "resourceVersion": "812",
            "creationTimestamp": "2026-12-01T09:59:58Z",
            "annotations": {ANNOTATION_DELETE_REQUESTED_AT: "2026-12-01T10:01:00.000001Z"},
            "finalizers": ["db.bnerd.com/tenant"],
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"consumer": "team-a", "externalId": "orders"},
        "status": STORED_STATUS,
    }
    obj.update(changes)
    return obj


def test_a_database_reads_typed_from_metadata_to_status() -> None:
    db = DatabaseObject.parse(database())
    assert (db.key, db.metadata.uid, db.metadata.generation, db.metadata.resource_version) == (
        "dbprovider/team-a-orders",
        "0d6b-uid",
        3,
        "812",
    )
    assert db.metadata.finalizers == ("db.bnerd.com/tenant",) and not db.metadata.deleting
    assert db.metadata.creation_timestamp == "2026-12-01T09:59:58Z"  # as the apiserver wrote it
    assert (db.spec.consumer, db.spec.external_id, db.status.phase) == ("team-a", "orders", Phase.READY)


def test_an_unchanged_status_dumps_back_exactly_as_stored() -> None:
    assert DatabaseObject.parse(database()).dump_status() == STORED_STATUS


def test_a_missing_or_null_status_is_an_empty_one() -> None:
    for obj in (database(status=None), {k: v for k, v in database().items() if k != "status"}):
        db = DatabaseObject.parse(obj)
        assert db.status.phase is None and db.dump_status() == {}


def test_an_invalid_spec_raises_and_an_invalid_status_is_the_readers_choice() -> None:
    with pytest.raises(ValidationError):
        DatabaseObject.parse(database(spec={"consumer": "Team A"}))
    with pytest.raises(ValidationError):
        DatabaseObject.parse(database(status={"phase": "Sleeping"}))
    db, status_valid = DatabaseObject.parse_lenient_status(database(status={"phase": "Sleeping"}))
    assert not status_valid and db.status.phase is None
    with pytest.raises(ValidationError):  # the spec is never lenient
        DatabaseObject.parse_lenient_status(database(spec={"consumer": "Team A"}, status={"phase": "Sleeping"}))


def test_metadata_knows_deletion_and_its_controller() -> None:
    meta = ObjectMeta.model_validate(
        {
            "name": "x-credentials",
            "deletionTimestamp": "2026-12-01T10:00:00Z",
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "Database", "name": "x", "uid": "u1"},
                {
                    "apiVersion": API_VERSION,
                    "kind": "Database",
                    "name": "y",
                    "uid": "u2",
                    "controller": True,
                },
            ],
        }
    )
    assert meta.deleting and meta.key == "x-credentials"
    assert meta.controlled_by("u2") and not meta.controlled_by("u1") and not meta.controlled_by(None)


def test_shards_and_consumers_parse_the_same_way() -> None:
    shard = ShardObject.parse(
        {
            "metadata": {"name": "shard-a", "generation": 1},
            "spec": {
                "maxDatabases": 10,
                "perconaCluster": {"namespace": "pg", "name": "c1"},
                "admin": {"serviceName": "c1-primary", "secretRef": {"namespace": "pg", "name": "admin"}},
                "client": {"host": "db.example.com"},
            },
            "status": {"databaseCount": 4, "serverVersion": "18.1"},
        }
    )
    assert (shard.key, shard.spec.max_databases, shard.status.database_count) == ("shard-a", 10, 4)
    consumer = ConsumerObject.parse(
        {"metadata": {"name": "team-a"}, "spec": {"tokenSecretRef": {"namespace": "dbprovider", "name": "t"}}}
    )
    assert consumer.spec.max_databases is None and consumer.status.database_count is None


def test_the_database_indexes_read_one_field_and_tolerate_what_is_not_there() -> None:
    assert database_shard(database()) == ["shard-a"] and database_consumer(database()) == ["team-a"]
    for odd in ({}, {"status": None}, {"status": {"shard": ""}}, {"status": "x"}, {"spec": {"consumer": 7}}):
        assert database_shard(odd) == [] and database_consumer(odd) == []


def test_the_resources_are_written_once_and_the_informers_use_the_same_type() -> None:
    assert InformersResource is type(DATABASES)
    # Spelt out, not built from API_VERSION: these URLs are the apiserver's contract (a version bump changes them here).
    assert DATABASES.object_path("a", "ns", "status") == "/apis/db.bnerd.com/v1alpha1/namespaces/ns/databases/a/status"
    assert SHARDS.collection_path() == "/apis/db.bnerd.com/v1alpha1/shards"


def test_a_document_of_unknown_shape_still_says_what_it_is() -> None:
    doc = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": 7}}
    assert Identity.of(doc) == Identity("v1", "Secret", "t", "")
    assert Identity.of(["not", "a", "mapping"]) == Identity("", "", "", "")
    assert Identity.of({"kind": 5, "metadata": "x"}) == Identity("", "5", "", "")  # the kind shown as written
