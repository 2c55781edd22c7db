"""The two Kubernetes time formats, and the parser reading what either (or another writer) wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from domain.timefmt import format_micro_time, format_time, parse_time

MOMENT = datetime(2026, 11, 30, 8, 15, 0, 123456, tzinfo=UTC)


def test_formats_are_utc_with_z() -> None:
    plus_two = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2026-11-30T08:15:00Z"
    assert format_micro_time(plus_two) == "2026-11-30T08:15:00.123456Z"
    assert format_time(MOMENT.replace(tzinfo=None)) == "2026-11-30T08:15:00Z"  # naive is UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T08:15:00Z", MOMENT.replace(microsecond=0)),
        ("2026-11-30T08:15:00.123456Z", MOMENT),
        ("2026-11-30T10:15:00+02:00", MOMENT.replace(microsecond=0)),
        ("2026-11-30T08:15:00", MOMENT.replace(microsecond=0)),
    ],
)
def test_parse_reads_z_offsets_and_naive(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected and parsed is not None and parsed.tzinfo is not None


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-13-01T00:00:00Z"])
def test_parse_refuses_nothing_loudly(text: str | None) -> None:
    assert parse_time(text) is None


def test_round_trip() -> None:
    assert parse_time(format_micro_time(MOMENT)) == MOMENT
    assert format_time(parse_time(format_time(MOMENT))) == format_time(MOMENT)  # type: ignore[arg-type]
