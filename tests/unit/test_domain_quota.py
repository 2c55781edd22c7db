"""The quota rule and the ledger's decisions (domain/quota.py): pure functions, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain.naming import DNS1123_SUBDOMAIN_MAX_LENGTH, is_dns1123_subdomain, quota_ledger_name
from domain.quota import QuotaLedger, counts_against_quota, decide, ledger_patch, release_patch, stale_keys

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=120)


def db(phase: str | None) -> dict:
    return {"status": {"phase": phase}} if phase else {}


@pytest.mark.parametrize(
    ("phase", "counts"),
    [(None, True), ("Provisioning", True), ("Ready", True), ("Failed", True), ("Deleting", True), ("Deleted", False)],
)
def test_databases_not_yet_deleted_count(phase: str | None, counts: bool) -> None:
    assert counts_against_quota(db(phase)) is counts


def ledger(**ages: float) -> QuotaLedger:
    return QuotaLedger("c", {key: NOW - timedelta(seconds=age) for key, age in ages.items()}, "41")


def test_grants_in_order_until_the_limit_counting_ledger_and_cache_once() -> None:
    decision = decide(ledger(a=1, b=1), counted_in_cache={"b", "c"}, prune=(), requested=["x", "y", "z"], limit=5)
    assert decision.granted == {"x", "y"} and decision.refused == {"z"}
    assert decision.reserve == {"x", "y"} and decision.counted == 5


def test_a_counted_database_is_granted_again_without_a_new_slot() -> None:
    decision = decide(ledger(a=1), counted_in_cache=(), prune=(), requested=["a", "a", "b"], limit=1)
    assert decision.granted == {"a"} and decision.refused == {"b"} and decision.reserve == frozenset()


def test_pruned_slots_are_free_and_no_limit_grants_everything() -> None:
    decision = decide(ledger(a=1, b=1), counted_in_cache=(), prune={"a", "unknown"}, requested=["x"], limit=2)
    assert decision.granted == {"x"} and decision.prune == {"a"}
    unlimited = decide(ledger(a=1), counted_in_cache=(), prune=(), requested=["x", "y"], limit=None)
    assert unlimited.granted == {"x", "y"} and unlimited.reserve == {"x", "y"}


def test_stale_keys_prune_deleted_and_check_old_ones_the_cache_lacks() -> None:
    cached = {"ready": db("Ready"), "deleting": db("Deleting"), "deleted": db("Deleted")}
    book = ledger(ready=999, deleting=999, deleted=1, young=119, old=120)
    prune, check = stale_keys(book, cached, NOW, TIMEOUT)
    assert prune == {"deleted"}
    assert check == {"old"}  # a young reservation may still be on its way to the apiserver


def test_parse_reads_times_and_keeps_an_unreadable_one_counted() -> None:
    parsed = QuotaLedger.parse(
        "c", {"metadata": {"resourceVersion": "7"}, "data": {"a": "2026-12-02T09:59:00.000000Z", "b": "garbage"}}
    )
    assert parsed.resource_version == "7"
    assert parsed.entries["a"] == NOW - timedelta(minutes=1)
    assert set(stale_keys(parsed, {}, NOW, TIMEOUT)[1]) == {"b"}  # old: checked, not dropped blindly
    assert QuotaLedger.parse("c", None).resource_version is None


def test_patches_are_conditional() -> None:
    book = ledger(a=1, b=1)
    decision = decide(book, (), prune={"a"}, requested=["x"], limit=None)
    patch = ledger_patch(book, decision, NOW)
    assert patch == {"metadata": {"resourceVersion": "41"}, "data": {"a": None, "x": "2026-12-02T10:00:00.000000Z"}}
    assert release_patch("x", NOW) == [
        {"op": "test", "path": "/data/x", "value": "2026-12-02T10:00:00.000000Z"},
        {"op": "remove", "path": "/data/x"},
    ]


@pytest.mark.parametrize("consumer", ["team-a", "a.b.c", "x" * 240, "y" * 253, "a-" * 120 + "b"])
def test_ledger_names_are_valid_and_unique(consumer: str) -> None:
    name = quota_ledger_name(consumer)
    assert is_dns1123_subdomain(name) and len(name) <= DNS1123_SUBDOMAIN_MAX_LENGTH
    assert name != quota_ledger_name(consumer[:-1] + ("z" if consumer[-1] != "z" else "q"))
    if len(consumer) <= 234:
        assert name == f"quota.{consumer}"
