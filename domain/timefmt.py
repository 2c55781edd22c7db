"""The two timestamp formats the provider writes, and the one parser it reads them with.

Kubernetes has two: metav1.Time (whole seconds, e.g. conditions' lastTransitionTime and our status
fields) and metav1.MicroTime (microseconds, e.g. a Lease's renewTime). The API's annotations use the
micro format so that two requests within one second are told apart. Everything is UTC with a `Z`.
"""

from __future__ import annotations

from datetime import UTC, datetime

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _utc(moment: datetime) -> datetime:
    """`moment` in UTC; a naive datetime is taken to be UTC already (as `parse_time` reads one)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def format_time(moment: datetime) -> str:
    """metav1.Time: RFC 3339 in UTC, whole seconds, e.g. 2026-11-30T08:15:00Z (the status format)."""
    return _utc(moment).strftime(TIME_FORMAT)


def format_micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with microseconds, e.g. 2026-11-30T08:15:00.123456Z."""
    return _utc(moment).strftime(MICRO_TIME_FORMAT)


def parse_time(value: str | None) -> datetime | None:
    """An aware datetime from RFC 3339 (`Z` or an offset; a naive value is UTC); None if empty or malformed."""
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
