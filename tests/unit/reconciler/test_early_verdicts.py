"""Settled verdicts reached while a start's lists page in (reconciler.database.early): the resync takes one
only for exactly the versions it was reached on; anything changed, unknown or late is looked at again."""

from __future__ import annotations

import copy
from typing import Any

from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT
from domain.credentials import Endpoint
from informers.informer import PageObserver
from reconciler.database.early import EarlyVerdicts
from reconciler.database.settled import settled
from tests.unit.reconciler.test_settled import CONFIG, ENDPOINT, ready_pair

Obj = dict[str, Any]
SHARD: Obj = {"metadata": {"name": "shard-a", "resourceVersion": "40"}, "client": ENDPOINT}


class Pages:
    """The page channel of one informer's first list (what `Informer.add_page_observer` registers)."""

    def __init__(self) -> None:
        self.observers: list[PageObserver] = []

    def has_synced(self) -> bool:
        return False  # the list starts after the observer is registered, as in a start

    def get(self, key: str) -> Obj | None:
        return None  # nothing stored before the list is complete

    def add_page_observer(self, observer: PageObserver) -> None:
        self.observers.append(observer)

    def page(self, objects: list[Obj], last: bool = False) -> None:
        for observer in self.observers:
            observer(objects, last)


def secret_key(db: Obj) -> str:
    return f"{db['metadata']['namespace']}/{db['metadata']['name']}-credentials"


def key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def setup(shards_first: bool = True) -> tuple[EarlyVerdicts, Pages, Pages, Pages]:
    """The three lists of a start; by default the Shards' one page has come already."""
    databases, secrets, shards = Pages(), Pages(), Pages()
    early = EarlyVerdicts(
        databases,  # type: ignore[arg-type]
        secrets,  # type: ignore[arg-type]
        shards,  # type: ignore[arg-type]
        secret_key,
        lambda db: db["status"]["shard"],
        lambda shard: shard["client"],  # the Shard's client endpoint, as its spec gives it
        lambda db, endpoint, secret: settled(db, endpoint, secret, CONFIG),
    )
    if shards_first:
        shards.page([SHARD], last=True)
    return early, databases, secrets, shards


def pair(name: str) -> tuple[Obj, Obj]:
    db, secret = ready_pair()
    db["metadata"]["name"] = name
    secret["metadata"]["name"] = f"{name}-credentials"
    secret["metadata"]["resourceVersion"] = "900"
    return db, secret


def test_a_database_is_judged_whichever_of_its_two_pages_comes_first() -> None:
    early, databases, secrets, _ = setup()
    first, first_secret = pair("first")
    second, second_secret = pair("second")
    databases.page([first])
    secrets.page([first_secret, second_secret], last=True)
    databases.page([second], last=True)
    assert (early.looked, early.found) == (2, 2)
    assert early.take(key(first), first, first_secret, ENDPOINT)
    assert early.take(key(second), second, second_secret, ENDPOINT)
    assert not early.take(key(first), first, first_secret, ENDPOINT)  # used up: a later resync looks again


def test_a_verdict_holds_only_for_the_versions_it_was_reached_on() -> None:
    early, databases, secrets, _ = setup()
    pairs = [pair(f"db-{i}") for i in range(3)]
    databases.page([db for db, _ in pairs], last=True)
    secrets.page([secret for _, secret in pairs], last=True)
    changed_db = copy.deepcopy(pairs[0][0])
    changed_db["metadata"]["resourceVersion"] = "813"  # a watch event after the page
    assert not early.take(key(changed_db), changed_db, pairs[0][1], ENDPOINT)
    changed_secret = {**pairs[1][1], "metadata": {**pairs[1][1]["metadata"], "resourceVersion": "901"}}
    assert not early.take(key(pairs[1][0]), pairs[1][0], changed_secret, ENDPOINT)
    moved = Endpoint("pg2.example.com", 5432, "verify-full")  # the Shard's client block changed meanwhile
    assert not early.take(key(pairs[2][0]), pairs[2][0], pairs[2][1], moved)


def test_what_the_full_pass_would_act_on_gets_no_verdict() -> None:
    early, databases, secrets, _ = setup()
    db, secret = pair("rotating")
    db["metadata"]["annotations"] = {ANNOTATION_ROTATE_REQUESTED_AT: "2026-12-02T01:00:00Z"}
    databases.page([db], last=True)
    secrets.page([secret], last=True)
    assert (early.looked, early.found) == (1, 0)
    assert not early.take(key(db), db, secret, ENDPOINT)


def test_a_pair_listed_before_its_shard_is_judged_when_the_shards_list_is_in() -> None:
    early, databases, secrets, shards = setup(shards_first=False)
    db, secret = pair("early")
    databases.page([db], last=True)
    secrets.page([secret], last=True)
    assert early.looked == 0
    shards.page([SHARD], last=True)
    assert (early.looked, early.found) == (1, 1)
    assert early.take(key(db), db, secret, ENDPOINT)


def test_no_verdict_without_the_shard_or_the_secret() -> None:
    early, databases, secrets, _ = setup()
    db, secret = pair("elsewhere")
    db["status"]["shard"] = "shard-gone"
    lonely, _ = pair("lonely")
    databases.page([db, lonely], last=True)
    secrets.page([secret], last=True)
    assert (early.looked, early.found) == (0, 0)
    assert not early.take(key(db), db, secret, ENDPOINT)
    assert not early.take(key(lonely), lonely, None, ENDPOINT)


def test_only_the_first_lists_are_looked_at() -> None:
    early, databases, secrets, _ = setup()
    db, secret = pair("relisted")
    databases.page([], last=True)
    secrets.page([], last=True)
    databases.page([db], last=True)  # a relist later: the resync is long past
    secrets.page([secret], last=True)
    assert (early.looked, early.found) == (0, 0)
    assert not early.take(key(db), db, secret, ENDPOINT)
