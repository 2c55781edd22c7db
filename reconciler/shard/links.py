"""What the Shard controller learnt about each shard's link, shared with the Database workers' sessions.

Two facts per shard, both written by the Shard controller's checks and read by `AdminSessions`:
- the round-trip estimate, from which the check's timeouts and the sessions' connect timeout are
  derived (`SETTINGS.shard_checks.timeouts`): measured by every check that passed, doubled (from a
  small guess) by every check that timed out, so a slow link is learnt within a few checks;
- whether the shard stopped answering (`not_answering`): set when a check could not get a new
  session through, cleared by the next check that could. While set, the Database workers' sessions
  to that shard are cut and no new one is opened: their work waits for the shard instead of hanging
  on it until the operation bound (two minutes).

Thread-safe: the checks run on the Shard controller's workers, the sessions on the Database workers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from domain.settings import SETTINGS, CheckTimeouts, ShardChecks


@dataclass
class _Link:
    round_trip: float = 0.0
    not_answering: str | None = None  # why (a sanitized failure), while the shard does not answer


class ShardLinks:
    def __init__(self, checks: ShardChecks = SETTINGS.shard_checks) -> None:
        self.checks = checks
        self._lock = threading.Lock()
        self._links: dict[str, _Link] = {}

    def _link(self, shard: str) -> _Link:
        link = self._links.get(shard)
        if link is None:
            link = self._links[shard] = _Link()
        return link

    def round_trip(self, shard: str) -> float:
        with self._lock:
            return self._link(shard).round_trip

    def timeouts(self, shard: str) -> CheckTimeouts:
        """The current bounds of a check of `shard` (its connect bound also bounds the sessions')."""
        return self.checks.timeouts(self.round_trip(shard))

    def measured(self, shard: str, round_trip: float) -> None:
        """A check passed and one statement took `round_trip` seconds."""
        with self._lock:
            self._link(shard).round_trip = round_trip

    def timed_out(self, shard: str) -> None:
        """A check ran out of time: assume a slower link next time (bounded by the maximum timeouts)."""
        with self._lock:
            link = self._link(shard)
            link.round_trip = max(self.checks.min_round_trip_guess, 2 * link.round_trip)

    def not_answering(self, shard: str) -> str | None:
        """Why the shard is taken as not answering, or None."""
        with self._lock:
            link = self._links.get(shard)
            return None if link is None else link.not_answering

    def set_not_answering(self, shard: str, why: str | None) -> bool:
        """Record the outcome of a check (None: it answered); True when the shard was answering before."""
        with self._lock:
            link = self._link(shard)
            newly = why is not None and link.not_answering is None
            link.not_answering = why
            return newly

    def forget(self, shard: str) -> None:
        with self._lock:
            self._links.pop(shard, None)
