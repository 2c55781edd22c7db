"""The Database pass's working state reads its metadata typed: parsed with the spec and status when the
pass reads the object, replaced by a metadata write's answer without losing the status being built."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, API_VERSION, FINALIZER_TENANT, Phase
from reconciler.database.state import Database

STORED: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "Database",
    "metadata": {
        "name": "d",
        "namespace": "n",
        "uid": "u",
        "resourceVersion": "7",
        "generation": 2,
        "annotations": {ANNOTATION_DELETE_REQUESTED_AT: "2026-12-01T10:00:00.000001Z"},
        "finalizers": [FINALIZER_TENANT],
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {"consumer": "c", "externalId": "e"},
    "status": {"phase": "Ready", "shard": "s", "tenantName": "t_e_1"},
}


def stored(**metadata: Any) -> dict[str, Any]:
    obj = copy.deepcopy(STORED)
    obj["metadata"].update(metadata)
    return obj


def test_the_pass_reads_metadata_spec_and_status_typed() -> None:
    database = Database.read(stored(deletionTimestamp="2026-12-01T10:01:00Z"))
    assert (database.key, database.uid, database.resource_version, database.generation) == ("n/d", "u", "7", 2)
    assert database.deleting and database.finalizers == (FINALIZER_TENANT,)
    assert ANNOTATION_DELETE_REQUESTED_AT in database.annotations
    assert (database.spec.external_id, database.status.phase, database.shard) == ("e", Phase.READY, "s")
    assert not Database.read(stored()).deleting


def test_a_metadata_writes_answer_replaces_the_metadata_and_keeps_the_status_being_built() -> None:
    database = Database.read(stored())
    database.update(phase=Phase.DELETING)
    database.written(stored(resourceVersion="8", finalizers=[]))
    assert (database.resource_version, database.finalizers) == ("8", ())
    assert database.status.phase == Phase.DELETING  # not yet written: still the pass's
    database.load(stored(resourceVersion="9"))
    assert (database.resource_version, database.status.phase) == ("9", Phase.READY)  # starts over from the object


@pytest.mark.parametrize("field", ["uid", "namespace", "resourceVersion"])
def test_a_field_the_apiserver_always_sends_is_never_read_as_none(field: str) -> None:
    obj = stored()
    del obj["metadata"][field]
    database = Database.read(obj)
    with pytest.raises(ValueError, match=f"metadata.{field}"):
        _ = (database.uid, database.key, database.resource_version)  # a KeyError before, never "None"


def test_an_object_that_does_not_fit_the_models_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValidationError, match="spec.consumer"):
        Database.read({**stored(), "spec": {"consumer": "Not A Name", "externalId": "e"}})
    with pytest.raises(ValidationError, match="metadata"):
        Database.read({k: v for k, v in stored().items() if k != "metadata"})
