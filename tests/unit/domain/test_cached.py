"""What the caches keep of each kind (domain.cached): the readers of the controllers and the API answer the
same on an object as the cache keeps it as on the whole object, so a field read but dropped fails here; a
Secret's data is never kept, and reading values from a cached Secret fails loudly."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from api.auth import token_secret_names
from api.models import database_view, read_database
from domain.cached import CACHED, LAST_APPLIED, SECRETS, cached_form, without_bookkeeping
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_RESTORE_TENANT,
    ANNOTATION_ROTATE_END_SESSIONS,
    ANNOTATION_ROTATE_REQUESTED_AT,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
)
from domain.credentials import (
    CACHED_CONTROLLER_UID,
    DIGEST,
    Endpoint,
    classify_secret,
    decode_secret_data,
    encode_secret_value,
    is_controlled_by,
    password_id,
    secret_settled,
)
from domain.metadata import ObjectMeta
from domain.objects import (
    ConsumerObject,
    DatabaseGlance,
    DatabaseObject,
    ShardObject,
    consumer_disabled,
    database_placement,
)
from domain.resources import CONSUMERS, DATABASES, SHARDS, database_consumer, database_shard
from domain.specs import database_consumer_name, database_external_id, parse_consumer, parse_shard
from informers import object_key
from informers.informer import resource_version_of
from reconciler.database.settled import settled
from reconciler.database.state import Database
from tests.unit.reconciler.test_settled import CONFIG, ENDPOINT, TENANT, ready_pair

Obj = dict[str, Any]
MANAGED = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]


def full_database() -> Obj:
    """A Ready Database with every metadata field set, as the apiserver sends it."""
    db, _ = ready_pair()
    db["metadata"].update(
        creationTimestamp="2026-12-01T00:00:00Z",
        labels={LABEL_CONSUMER: "team-a", LABEL_EXTERNAL_ID: "orders"},
        annotations={ANNOTATION_ROTATE_REQUESTED_AT: "2026-12-01T00:00:01.000000Z", LAST_APPLIED: "{}"},
        managedFields=MANAGED,
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-1"}],
        selfLink="/apis/x",
    )
    return db


def variants(db: Obj) -> list[Obj]:
    """The Database, and as the paths of a pass would differ: deleting, delete or rotate requested, restored."""
    out = [db]
    for annotation, value in (
        (ANNOTATION_DELETE_REQUESTED_AT, "2026-12-01T00:00:02.000000Z"),
        (ANNOTATION_ROTATE_END_SESSIONS, "2026-12-01T00:00:01.000000Z"),
        (ANNOTATION_RESTORE_TENANT, "shard-b/t_old"),
    ):
        other = copy.deepcopy(db)
        other["metadata"]["annotations"][annotation] = value
        out.append(other)
    deleting = copy.deepcopy(db)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:03Z"
    return [*out, deleting]


def same(reader: Callable[[Obj], Any], full: Obj, cached: Obj) -> None:
    assert _plain(reader(full)) == _plain(reader(cached))


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, DatabaseGlance):
        return tuple(value)
    return json.loads(json.dumps(value, default=repr))


def test_the_readers_of_a_database_answer_the_same_on_the_cached_form() -> None:
    _, secret = ready_pair()
    cached_secret = cached_form(SECRETS)(copy.deepcopy(secret))
    for full in variants(full_database()):
        del full["metadata"]["annotations"][LAST_APPLIED]  # dropped on purpose: the parsed annotations would differ
        cached = cached_form(DATABASES)(copy.deepcopy(full))
        readers: list[Callable[[Obj], Any]] = [
            read_database,
            DatabaseObject.parse,
            lambda o: database_view(DatabaseObject.parse(o), CONFIG),
            lambda o: Database.read(o).status_body(),
            lambda o: (Database.read(o).annotations, Database.read(o).finalizers, Database.read(o).deleting),
            lambda o: ObjectMeta.of(o),
            lambda o: settled(o, ENDPOINT, secret, CONFIG),
            lambda o: settled(o, ENDPOINT, cached_secret, CONFIG),
            DatabaseGlance.of,
            database_placement,
            database_consumer,
            database_shard,
            database_consumer_name,
            database_external_id,
            object_key,
            resource_version_of,
        ]
        for reader in readers:
            same(reader, full, cached)


def test_the_cache_drops_what_nobody_reads() -> None:
    cached = cached_form(DATABASES)(full_database())
    assert "managedFields" not in cached["metadata"] and "selfLink" not in cached["metadata"]
    assert LAST_APPLIED not in cached["metadata"]["annotations"]
    # Strings that repeat across the fleet are held once.
    one, two = (cached_form(DATABASES)(json.loads(json.dumps(full_database()))) for _ in range(2))
    assert one["status"]["shard"] is two["status"]["shard"]
    assert one["status"]["conditions"][0]["reason"] is two["status"]["conditions"][0]["reason"]
    assert one["metadata"]["finalizers"] is two["metadata"]["finalizers"]
    # A Database and its credentials Secret hold one string of the uid and password id they both name.
    db, secret = ready_pair()
    cached_db, cached_secret = cached_form(DATABASES)(db), cached_form(SECRETS)(secret)
    assert cached_secret[CACHED_CONTROLLER_UID] is cached_db["metadata"]["uid"]
    assert password_id(cached_secret) is cached_db["status"]["passwordApplied"]


def full_secret() -> Obj:
    _, secret = ready_pair()
    secret["metadata"].update(
        uid="s-1", resourceVersion="900", creationTimestamp="2026-12-01T00:00:00Z", managedFields=MANAGED
    )
    secret["metadata"]["annotations"][LAST_APPLIED] = json.dumps({"data": secret["data"]})
    return secret


def test_a_cached_secret_holds_no_data_and_answers_what_decides_it_is_current() -> None:
    full = full_secret()
    cached = cached_form(SECRETS)(copy.deepcopy(full))
    assert "data" not in cached and LAST_APPLIED not in cached["metadata"].get("annotations", {})
    assert encode_secret_value("a-password") not in json.dumps(cached)
    del full["metadata"]["annotations"][LAST_APPLIED]  # dropped on purpose: the parsed annotations would differ
    uid = full["metadata"]["ownerReferences"][0]["uid"]
    # Its labels, uid and the rest of its owner reference (what ObjectMeta parses) are read from the
    # apiserver's answers only: the cached Secret answers who it is, its version, its password id and owner.
    readers: list[Callable[[Obj], Any]] = [
        object_key,
        resource_version_of,
        password_id,
        lambda s: is_controlled_by(s, uid),
        lambda s: secret_settled(s, uid, TENANT, ENDPOINT),
        lambda s: secret_settled(s, uid, TENANT, Endpoint("other.example.com", 5432, "verify-full")),
        lambda s: secret_settled(s, uid, "t_other", ENDPOINT),
        lambda s: secret_settled(s, "another-uid", TENANT, ENDPOINT),
    ]
    for reader in readers:
        same(reader, full, cached)
    for key, raw in (("password", ""), ("password", "not base64!"), ("host", encode_secret_value("x.example"))):
        changed = copy.deepcopy(full)
        changed["data"][key] = raw
        assert not secret_settled(changed, uid, TENANT, ENDPOINT)
        assert not secret_settled(cached_form(SECRETS)(copy.deepcopy(changed)), uid, TENANT, ENDPOINT)


def test_reading_values_from_a_cached_secret_fails_loudly() -> None:
    cached = cached_form(SECRETS)(full_secret())
    assert cached[DIGEST]
    with pytest.raises(ValueError, match="holds no data"):
        decode_secret_data(cached)
    with pytest.raises(ValueError, match="holds no data"):
        classify_secret(cached, cached[CACHED_CONTROLLER_UID], TENANT)


def shard() -> Obj:
    return {
        "apiVersion": "db.bnerd.com/v1alpha1",
        "kind": "Shard",
        "metadata": {"name": "shard-a", "uid": "s", "resourceVersion": "1", "generation": 3, "managedFields": MANAGED},
        "spec": {
            "maxDatabases": 100,
            "perconaCluster": {"namespace": "pg", "name": "a"},
            "admin": {"serviceName": "a-primary", "secretRef": {"namespace": "pg", "name": "admin"}},
            "client": {"host": "pg.example.com", "port": 5432, "sslmode": "verify-full"},
        },
        "status": {"phase": "Ready", "databaseCount": 3},
    }


def consumer() -> Obj:
    return {
        "apiVersion": "db.bnerd.com/v1alpha1",
        "kind": "Consumer",
        "metadata": {"name": "team-a", "uid": "c", "resourceVersion": "2", "managedFields": MANAGED},
        "spec": {"tokenSecretRef": {"namespace": "dbprovider", "name": "team-a-token"}, "maxDatabases": 5},
        "status": {"databaseCount": 1},
    }


def test_the_readers_of_shards_and_consumers_answer_the_same_on_the_cached_form() -> None:
    full_shard, full_consumer = shard(), consumer()
    cached_shard = cached_form(SHARDS)(copy.deepcopy(full_shard))
    for reader in (ShardObject.parse, parse_shard, ObjectMeta.of, object_key):
        same(reader, full_shard, cached_shard)
    cached_consumer = cached_form(CONSUMERS)(copy.deepcopy(full_consumer))
    for reader in (ConsumerObject.parse, parse_consumer, consumer_disabled, token_secret_names, ObjectMeta.of):
        same(reader, full_consumer, cached_consumer)


def test_every_kind_the_caches_hold_keeps_its_key_and_version() -> None:
    """What the informers key, compare and index objects by."""
    for resource, form in CACHED.items():
        kept = form.apply({"metadata": {"name": "n", "namespace": "ns", "uid": "u", "resourceVersion": "7"}})
        assert (object_key(kept), resource_version_of(kept)) == ("ns/n", "7"), resource


def test_an_object_kept_by_name_loses_only_its_bookkeeping() -> None:
    token = {
        "metadata": {"name": "t", "managedFields": MANAGED, "annotations": {LAST_APPLIED: "{}", "keep": "me"}},
        "data": {"sha256": "YWJj"},
    }
    assert without_bookkeeping(copy.deepcopy(token)) == {
        "metadata": {"name": "t", "annotations": {"keep": "me"}},
        "data": {"sha256": "YWJj"},
    }
