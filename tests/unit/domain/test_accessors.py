"""The cheap typed reads of domain.metadata and domain.objects: one field of a raw object, for the paths where
a whole parse would be the cost (authentication, informer handlers, the queue's lane), a LIST page, and
the lenient status the CLI shows; plus ObjectMeta of kinds that are not modelled whole."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, Phase
from domain.metadata import ListPage, ObjectMeta, object_annotation, object_label, object_name
from domain.objects import consumer_disabled, database_placement, lenient_status
from domain.status import DatabaseStatus, ShardStatus

READY = {
    "type": "Ready",
    "status": "True",
    "reason": "Provisioned",
    "message": "",
    "lastTransitionTime": "2026-12-01T10:00:00Z",
}
STORED_STATUS: dict[str, Any] = {"phase": "Ready", "shard": "shard-a", "conditions": [READY]}


NOTED = {"name": "team-a-orders", "annotations": {ANNOTATION_DELETE_REQUESTED_AT: "2026-12-01T10:01:00.000001Z"}}


def database(status: object = STORED_STATUS) -> dict[str, Any]:
    """A Database as the cache holds it (only what these reads look at)."""
    return {"metadata": NOTED, "spec": {"consumer": "team-a", "externalId": "orders"}, "status": status}


def test_the_metadata_of_a_kind_not_modelled_whole_parses_alone() -> None:
    meta = {"name": "t", "namespace": "ns", "resourceVersion": "9", "labels": {"a": "b"}}
    secret = {"kind": "Secret", "metadata": meta, "data": {"k": "dg=="}}
    parsed = ObjectMeta.of(secret)
    assert (parsed.key, parsed.resource_version, parsed.labels) == ("ns/t", "9", {"a": "b"})
    with pytest.raises(ValidationError):  # the apiserver always sends metadata: its absence is a bug
        ObjectMeta.of({"kind": "Secret"})


def test_the_cheap_accessors_read_one_field_and_tolerate_what_is_not_there() -> None:
    db = database({**STORED_STATUS, "tenantName": "t_orders_1"})
    assert object_name(db) == "team-a-orders"
    assert object_annotation(db, ANNOTATION_DELETE_REQUESTED_AT) == "2026-12-01T10:01:00.000001Z"
    assert object_annotation(db, "other") is None and object_label(db, ANNOTATION_DELETE_REQUESTED_AT) is None
    assert object_label({"metadata": {"labels": {"app": "x"}}}, "app") == "x"  # no name needed
    assert database_placement(db) == ("shard-a", "t_orders_1")
    assert database_placement(database()) == ("shard-a", None)
    odd_objects: list[dict[str, Any]] = [
        {},
        {"metadata": None, "status": None, "spec": None},
        {"metadata": "x", "status": "x", "spec": "x"},
        {"metadata": {"name": "", "annotations": {"other": 7}}, "status": {"shard": 7, "tenantName": ""}},
    ]
    for odd in odd_objects:
        assert object_name(odd) is None and object_annotation(odd, "other") is None
        assert database_placement(odd) == (None, None) and not consumer_disabled(odd)


def test_only_a_true_disabled_disables_a_consumer() -> None:
    assert consumer_disabled({"spec": {"disabled": True}})
    for value in (False, "true", 1, None):
        assert not consumer_disabled({"spec": {"disabled": value}})


def test_a_lenient_status_reads_what_validates_and_is_empty_otherwise() -> None:
    assert lenient_status(DatabaseStatus, database()).phase == Phase.READY
    assert lenient_status(DatabaseStatus, database({"phase": "Sleeping"})) == DatabaseStatus()
    kept = lenient_status(DatabaseStatus, database({**STORED_STATUS, "phase": "Sleeping", "shard": 7}))
    assert (kept.phase, kept.shard, len(kept.conditions)) == (None, None, 1)  # only what was refused is unset
    assert lenient_status(ShardStatus, {"status": {"databaseCount": 4, "connectionBudget": -1}}).database_count == 4
    assert lenient_status(ShardStatus, {"status": None}) == ShardStatus()
    assert lenient_status(ShardStatus, {"status": {"databaseCount": 4}}).database_count == 4


def test_a_list_page_gives_its_items_and_the_next_pages_token() -> None:
    page = ListPage.of({"kind": "DatabaseList", "metadata": {"continue": "abc"}, "items": [database()]})
    assert page.continue_token == "abc" and [object_name(item) for item in page.items] == ["team-a-orders"]
    last = ListPage.of({"metadata": {"continue": ""}, "items": None})
    assert last == ListPage([], None)
