"""Placement leaves a shard at once when its SQL fails, and comes back to it once a check passes.

Two Patroni shards take a steady stream of creates; the admin endpoint (the primary endpoint) of one
of them goes silent. The first statement there that times out suspends the shard: every database
placed from then on goes to the other shard, long before the silent shard's periodic check is due (it
is set to a minute here) and before its triggered check declares it Unreachable. When the endpoint
answers again, a check passes and new databases are placed there again; the ones caught on it turn
Ready.
"""

from __future__ import annotations

import threading
import time

import pytest

from harness.patroni import PatroniShard
from tests.patroni.conftest import Fleet
from tests.support.common import condition

pytestmark = pytest.mark.server
PACE = 0.5  # a create every PACE seconds after the fault, until the silent shard is declared Unreachable
STREAM_LIMIT = 60.0
PERIODIC_CHECK = 60.0  # the Ready shards' check interval: far beyond this test's fault
POLL = 0.2
RETURN_WITHIN = 40.0
# A Database's Ready reasons after a statement on its shard failed (its Ready login's failure is not one).
STATEMENT_FAILED = ("AdminUnavailable", "EnsureFailed")


class Placements:
    """Polls the Databases: when each was first seen placed and where, and when the first one placed on
    `silent` reported a failed statement."""

    def __init__(self, fleet: Fleet, silent: str) -> None:
        self.fleet = fleet
        self.silent = silent
        self.placed: dict[str, tuple[str, float]] = {}
        self.first_failure: float | None = None
        self.names: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Placements:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        while not self._stop.wait(POLL):
            now = time.monotonic()
            for name in list(self.names):
                db = self.fleet.get_database(name) or {}
                shard = (db.get("status") or {}).get("shard")
                if shard and name not in self.placed:
                    self.placed[name] = (shard, now)
                ready = condition(db, "Ready") or {}
                failed = ready.get("reason") in STATEMENT_FAILED
                if shard == self.silent and failed and self.first_failure is None:
                    self.first_failure = now


def test_a_silent_primary_gets_no_new_databases_until_it_answers_again(
    patroni18: PatroniShard, patroni16: PatroniShard, fleet: Fleet, start_manager
) -> None:
    silent_cluster = patroni18
    silent = fleet.patroni_shard(silent_cluster)
    healthy = fleet.patroni_shard(patroni16)
    start_manager(shard_ping_interval=PERIODIC_CHECK)
    for shard in (silent, healthy):
        fleet.wait_shard(shard, "Ok", timeout=60)
    for i in range(2):  # sessions to both shards are open in the Database workers' pools
        fleet.wait_phase(fleet.database(f"warm-{i}"), "Ready", timeout=120)

    with Placements(fleet, silent) as placements:
        silent_cluster.primary.proxy.blackhole()
        faulted = time.monotonic()
        try:
            # Creates go on until the silent shard's own check has declared it Unreachable.
            not_ready = None
            while not_ready is None and time.monotonic() - faulted < STREAM_LIMIT:
                placements.names.append(fleet.database(f"stream-{len(placements.names)}"))
                time.sleep(PACE)
                if (condition(fleet.get_shard(silent), "Ready") or {}).get("reason") == "Unreachable":
                    not_ready = time.monotonic()
            assert not_ready is not None, f"{silent} was not declared Unreachable within {STREAM_LIMIT:.0f}s"
            for name in placements.names:
                fleet.wait_database(name, lambda db: bool((db.get("status") or {}).get("shard")), timeout=60)
        finally:
            silent_cluster.primary.proxy.heal()
        first_failure = placements.first_failure
        assert first_failure is not None, f"no statement on {silent} was seen failing"
        # Placed after its first failed statement (plus the poll's slack): none on the silent shard.
        late = {name: shard for name, (shard, seen) in placements.placed.items() if seen > first_failure + 2 * POLL}
        assert late and set(late.values()) == {healthy}, late
        # ... and that happened before its own check declared it Unreachable.
        assert any(seen < not_ready for _, (_, seen) in placements.placed.items() if seen > first_failure)
        print(
            f"\nfirst failed statement {first_failure - faulted:.1f} s after the fault, shard Unreachable "
            f"{not_ready - faulted:.1f} s after it; placed on the silent shard after the fault: "
            f"{sum(1 for shard, _ in placements.placed.values() if shard == silent)} of {len(placements.names)}"
        )

    fleet.wait_shard(silent, "Ok", timeout=60)
    for name in placements.names:  # the ones caught on the silent shard too
        fleet.wait_phase(name, "Ready", timeout=180)
    # The silent shard now holds far fewer databases: placement uses it again. (A statement of the caught
    # databases' catch-up that fails or is slow under load suspends it again until the check it triggers
    # passes, and triggered checks run at most every 10 s: creates for up to RETURN_WITHIN seconds.)
    again: list[str] = []
    started = time.monotonic()
    while not again or (again[-1] != silent and time.monotonic() - started < RETURN_WITHIN):
        name = fleet.database(f"after-{len(again)}")
        again.append(fleet.wait_phase(name, "Ready", timeout=120)["status"]["shard"])
    assert silent in again, again
    print(f"placed after the recovery: {again}")
