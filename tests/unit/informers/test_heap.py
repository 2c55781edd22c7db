"""The cycle collector around the caches' fills (informers.heap): full collections wait while the lists run (a
start's and every relist's), come back afterwards whoever leaves last, and the filled caches are frozen only on
success; after a relist, only once a full collection has freed what the deferral let pile up."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from informers.heap import DEFERRED, caches_filling, caches_released, listing


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    caches_released()  # this test process' heap goes back to the collector, no start's caches count as frozen
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


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_relist_collects_what_piled_up_then_freezes_its_survivors(thresholds: tuple[int, int, int]) -> None:
    with caches_filling():  # the manager's start
        pass
    with listing():
        assert gc.get_threshold() == (*thresholds[:2], DEFERRED)
        cache = [{"metadata": {"name": f"db-{i}"}} for i in range(1000)]
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        gc.collect(1)  # it outlives the young collections: only a full one frees it
        del cycle
    assert gc.get_threshold() == thresholds
    assert gone() is None  # collected before the freeze, not frozen for good
    assert gc.get_freeze_count() >= len(cache)
    caches_released()


def test_a_list_in_a_process_that_froze_nothing_freezes_nothing(thresholds: tuple[int, int, int]) -> None:
    gc.unfreeze()
    with listing():  # an informer of a test or a tool: no manager started
        assert gc.get_threshold() == (*thresholds[:2], DEFERRED)
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == 0


def test_a_list_inside_a_start_leaves_the_freeze_to_the_start(thresholds: tuple[int, int, int]) -> None:
    gc.unfreeze()
    with caches_filling():
        with listing():  # an informer's first list, while the manager waits for every cache
            pass
        assert gc.get_threshold()[2] == DEFERRED
        assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() > 0


def test_relists_in_several_threads_restore_the_thresholds_once_the_last_is_done(
    thresholds: tuple[int, int, int],
) -> None:
    entered, release = threading.Barrier(3), threading.Event()

    def relist() -> None:
        with listing():
            entered.wait()
            release.wait()

    threads = [threading.Thread(target=relist) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait()
    assert gc.get_threshold()[2] == DEFERRED
    release.set()
    for thread in threads:
        thread.join()
    assert gc.get_threshold() == thresholds


def test_a_relist_that_fails_midway_restores_the_thresholds_and_freezes_nothing(
    thresholds: tuple[int, int, int],
) -> None:
    with caches_filling():
        pass
    gc.unfreeze()  # to see that the failed relist freezes nothing (the start's caches count as frozen)
    with pytest.raises(ConnectionError), listing():
        raise ConnectionError("the apiserver went away mid-list")
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == 0
    caches_released()
