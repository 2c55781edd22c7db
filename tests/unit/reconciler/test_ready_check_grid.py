"""The Ready checks' grid (ShardController.ready_interval): a delay ends on the grid, never later than
asked, less than one grid step earlier, and never below half of itself (short test intervals)."""

from __future__ import annotations

import math
import random

from domain.settings import SETTINGS
from reconciler.shard.controller import on_grid

GRID = SETTINGS.shard_checks.ready_check_grid


def test_delays_end_on_the_grid_within_one_step_before_what_was_asked() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        now = rng.uniform(0, 1e6)
        delay = 60.0 * rng.uniform(0.1, 1.0)
        got = on_grid(delay, 60.0, now)
        assert delay - GRID < got <= delay + 1e-9
        ends = (now + got) / GRID
        assert math.isclose(ends, round(ends), abs_tol=1e-6)


def test_checks_due_in_the_same_step_start_together() -> None:
    now = 1000.3
    due = {round(now + on_grid(57.0 + step / 10, 60.0, now), 6) for step in range(int(GRID * 10))}
    assert len(due) <= 2  # twenty delays two seconds wide: one or two starts, not twenty


def test_a_short_interval_gets_a_finer_grid_and_never_a_delay_below_half() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        now = rng.uniform(0, 1e6)
        interval = rng.choice([0.2, 1.0, 3.0, 15.0])
        delay = interval * rng.uniform(0.1, 1.0)
        got = on_grid(delay, interval, now)
        assert delay / 2 <= got <= delay + min(GRID, interval / 4) + 1e-9
