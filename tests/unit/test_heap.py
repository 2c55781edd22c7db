"""The cycle collector around the caches' first fill (reconciler.runtime.heap): full collections wait while
the lists run, come back afterwards whoever leaves last, and the filled caches are frozen only on success."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from reconciler.runtime.heap import DEFERRED, caches_filling, caches_released


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.unfreeze()  # this test process' heap goes back to the collector
    assert gc.get_threshold() == before


def test_full_collections_wait_for_the_fill_then_the_caches_are_frozen(thresholds: tuple[int, int, int]) -> None:
    gc.unfreeze()
    with caches_filling():
        assert gc.get_threshold() == (*thresholds[:2], DEFERRED)
        caches = [{"metadata": {"name": f"db-{i}"}} for i in range(1000)]
    assert gc.get_threshold() == thresholds  # a later growth is collected as before
    assert gc.get_freeze_count() >= len(caches)  # never walked by a full collection again
    caches_released()  # the manager stopped
    assert gc.get_freeze_count() == 0


def test_overlapping_starts_restore_the_thresholds_once_the_last_one_leaves(thresholds: tuple[int, int, int]) -> None:
    outer = caches_filling()
    inner = caches_filling()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first one done: the other still lists
    assert gc.get_threshold()[2] == DEFERRED
    inner.__exit__(None, None, None)
    assert gc.get_threshold() == thresholds


def test_a_failed_start_freezes_nothing(thresholds: tuple[int, int, int]) -> None:
    gc.unfreeze()
    with pytest.raises(TimeoutError), caches_filling():
        raise TimeoutError("informers not synced")
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == 0
