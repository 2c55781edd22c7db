"""The quota rule and the ledger's slots (domain/quota.py): pure functions, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain.naming import DNS1123_SUBDOMAIN_MAX_LENGTH, is_dns1123_subdomain, quota_ledger_name
from domain.quota import (
    FREE,
    Holder,
    QuotaLedger,
    StaleHolders,
    choose_free,
    claim_patch,
    counts_against_quota,
    release_patch,
    restructure,
    restructure_patch,
    stale_holders,
)

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=120)
SKEW = timedelta(seconds=60)


def db(phase: str | None) -> dict:
    return {"status": {"phase": phase}} if phase else {}


@pytest.mark.parametrize(
    ("phase", "counts"),
    [(None, True), ("Provisioning", True), ("Ready", True), ("Failed", True), ("Deleting", True), ("Deleted", False)],
)
def test_databases_not_yet_deleted_count(phase: str | None, counts: bool) -> None:
    assert counts_against_quota(db(phase)) is counts


def ledger(*holders: tuple[str, float] | None) -> QuotaLedger:
    """Slots "0", "1", ... in order: (externalId, age in seconds) or None (free)."""
    slots = {str(n): None if h is None else Holder(h[0], NOW - timedelta(seconds=h[1])) for n, h in enumerate(holders)}
    return QuotaLedger("c", slots, "41")


def test_a_new_ledger_has_one_slot_per_allowed_database_and_adopts_what_the_cache_counts() -> None:
    data = restructure(QuotaLedger("c"), counted_in_cache=["old"], gone=(), limit=3, now=NOW)
    assert data is not None and len(data) == 3
    assert sorted(v for v in data.values()) == ["", "", f"old {NOW:%Y-%m-%dT%H:%M:%S}.000000Z"]


def test_nothing_to_change_writes_nothing() -> None:
    assert restructure(ledger(("a", 1), None), counted_in_cache=["a"], gone=(), limit=2, now=NOW) is None


def test_a_database_holding_two_slots_gives_one_back() -> None:
    """Two replicas can each claim a slot for the same externalId (a client retrying its PUT on another
    replica whose view of the ledger lacked the first claim); the next restructure keeps one of them."""
    book = ledger(("a", 1), ("dup", 2), ("dup", 1))
    data = restructure(book, counted_in_cache=["a", "dup"], gone=(), limit=3, now=NOW)
    assert data is not None
    held = [v.split(" ")[0] for v in data.values() if v != FREE]
    assert sorted(held) == ["a", "dup"] and len(data) == 3


def test_gone_databases_free_their_slots_and_the_size_follows_the_limit() -> None:
    book = ledger(("a", 1), ("b", 1), None)
    data = restructure(book, counted_in_cache=["a"], gone={"b"}, limit=4, now=NOW)
    assert data is not None
    assert [k for k, v in data.items() if v.startswith("a ")] == ["0"]  # a held slot keeps its key
    assert len(data) == 4 and sum(1 for v in data.values() if v == FREE) == 3
    patch = restructure_patch(book, data)
    assert patch["metadata"] == {"resourceVersion": "41"}
    assert patch["data"]["1"] == FREE and "0" not in patch["data"]


def test_a_lowered_limit_keeps_every_counted_database_and_no_free_slot() -> None:
    data = restructure(ledger(("a", 1), ("b", 1), ("c", 1), None, None), counted_in_cache=(), gone=(), limit=2, now=NOW)
    assert data is not None and len(data) == 3 and FREE not in data.values()


def test_stale_holders_free_deleted_ones_and_check_old_ones_the_cache_lacks() -> None:
    cached = {"ready": db("Ready"), "deleting": db("Deleting"), "deleted": db("Deleted")}
    book = ledger(("ready", 999), ("deleting", 999), ("deleted", 1), ("young", 119), ("old", 120))
    found = stale_holders(book, cached, NOW, TIMEOUT, SKEW)
    assert found.free == {"deleted"}
    assert found.check == {"old"}  # a young slot may belong to a create still on its way
    assert not found.implausible


def test_an_unreadable_holder_counts_and_is_checked() -> None:
    parsed = QuotaLedger.parse("c", {"metadata": {"resourceVersion": "7"}, "data": {"0": "garbage", "1": ""}})
    assert parsed.free() == ["1"] and set(parsed.held()) == {"garbage"}
    found = stale_holders(parsed, {}, NOW, TIMEOUT, SKEW)
    assert found.check == {"garbage"} and found.implausible == {"garbage": "malformed"}
    assert not QuotaLedger.parse("c", None).exists


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("ghost 2099-01-01T00:00:00Z", "future"),
        ("ghost 2026-12-02T10:01:01Z", "future"),  # just past the clock skew
        ("ghost", "malformed"),
        ("ghost 2026-12-02T10:00:00Z trailing", "malformed"),
        ("Ghost_Of_Nobody 2026-12-02T10:00:00Z", "unknown_holder"),
        ("-ghost 2026-12-02T10:00:00Z", "unknown_holder"),
        ("ghost 2026-12-02T10:00:59Z", None),  # within the clock skew: a replica with a clock ahead
        ("ghost 2026-12-02T09:59:00Z", None),  # young: a create still on its way
    ],
)
def test_a_holder_no_replica_can_have_written_is_checked_at_once(value: str, reason: str | None) -> None:
    parsed = QuotaLedger.parse("c", {"metadata": {"resourceVersion": "7"}, "data": {"0": value}})
    found = stale_holders(parsed, {}, NOW, TIMEOUT, SKEW)
    assert found.implausible == ({} if reason is None else {value.split(" ")[0]: reason})
    assert found.check == set(found.implausible)
    # Its database exists: it counts and stays, whatever the slot says.
    (external_id,) = parsed.held()
    assert stale_holders(parsed, {external_id: db("Ready")}, NOW, TIMEOUT, SKEW) == StaleHolders()


def test_a_replica_fills_from_its_cursor_and_jumps_into_the_longest_free_run() -> None:
    book = ledger(None, ("a", 1), None, None, None, None, ("b", 1), None)
    assert choose_free(book, 2, cursor=2) == (["2", "3"], 4)
    # From slot 0: one free, then a held slot: on in the middle of the longest free run (2..5).
    assert choose_free(book, 3, cursor=0) == (["0", "4", "5"], 6)
    assert choose_free(book, 9, cursor=0, taken={"3"}) == (["0", "5", "2", "4", "7"], 0)
    assert choose_free(ledger(("a", 1)), 1, cursor=0) == ([], 0)


def test_claims_and_releases_test_the_slot_first() -> None:
    holder = Holder("x", NOW)
    assert claim_patch({"7": holder, "9": Holder("y", NOW)}) == [
        {"op": "test", "path": "/data/7", "value": ""},
        {"op": "replace", "path": "/data/7", "value": "x 2026-12-02T10:00:00.000000Z"},
        {"op": "test", "path": "/data/9", "value": ""},
        {"op": "replace", "path": "/data/9", "value": "y 2026-12-02T10:00:00.000000Z"},
    ]
    assert release_patch("7", holder) == [
        {"op": "test", "path": "/data/7", "value": "x 2026-12-02T10:00:00.000000Z"},
        {"op": "replace", "path": "/data/7", "value": ""},
    ]
    assert Holder.parse(holder.value()) == holder


@pytest.mark.parametrize("consumer", ["team-a", "a.b.c", "x" * 240, "y" * 253, "a-" * 120 + "b"])
def test_ledger_names_are_valid_and_unique(consumer: str) -> None:
    name = quota_ledger_name(consumer)
    assert is_dns1123_subdomain(name) and len(name) <= DNS1123_SUBDOMAIN_MAX_LENGTH
    assert name != quota_ledger_name(consumer[:-1] + ("z" if consumer[-1] != "z" else "q"))
    if len(consumer) <= 234:
        assert name == f"quota.{consumer}"
