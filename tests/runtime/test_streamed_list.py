"""The informers fill their caches from a streamed list (a WATCH with sendInitialEvents) and watch on from
the same stream; an apiserver that refuses it is listed page by page. Why it matters: once etcd has been
compacted past a collection's last write, the apiserver serves every page of a paginated LIST after the
first from etcd, decoding each object again (3x its CPU for a manager start at 100,000 Databases)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from domain.settings import Backoff
from harness import KubeControlPlane
from informers import ADDED, CONFIGMAPS, MODIFIED, Informer, Rest
from tests.runtime.support import Recorder, configmap
from tests.support.common import unique, wait_for


def _fetched_from_etcd(rest: Rest, resource: str) -> float:
    """Objects the apiserver has read from etcd to answer LISTs of `resource` (its own counter)."""
    total = 0.0
    for line in rest.get_bytes("/metrics").decode().splitlines():
        if line.startswith("apiserver_storage_list_fetched_objects_total{") and f'resource="{resource}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextmanager
def _apiserver_with_configmaps(apiserver_args: list[str], prefix: str, count: int) -> Iterator[tuple[Rest, str]]:
    """An apiserver of its own, started with `apiserver_args`: a client and a namespace holding `count` ConfigMaps."""
    with KubeControlPlane(extra_args=apiserver_args) as kube, kube.admin_client() as api:
        rest = Rest(api)
        namespace = unique(f"rt-{prefix}")
        kube.ensure_namespace(namespace)
        for n in range(count):
            rest.create(CONFIGMAPS, configmap(f"{prefix}-{n}", namespace))
        yield rest, namespace


def _fill(rest: Rest, namespace: str, *, stream_lists: bool, page_size: int) -> Informer:
    informer = Informer(rest, CONFIGMAPS, namespace, stream_lists=stream_lists, page_size=page_size).start()
    assert informer.wait_for_sync(20), informer.sync_problem()
    return informer


def test_the_cache_fills_from_a_streamed_list_and_watches_on_from_the_same_stream(
    admin_rest: Rest, namespace: str
) -> None:
    names = {f"streamed-{n}" for n in range(7)}
    for name in names:
        admin_rest.create(CONFIGMAPS, configmap(name, namespace, {"v": "1"}))
    informer = Informer(admin_rest, CONFIGMAPS, namespace, page_size=3)
    batches: list[tuple[int, bool, bool]] = []
    informer.add_page_observer(lambda objects, last: batches.append((len(objects), last, informer.has_synced())))
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    try:
        assert informer.wait_for_sync(20), informer.sync_problem()
        assert informer.stats["streamed"] == 1 and informer.stats["lists"] == 1
        assert informer.last_list is not None and informer.last_list.streamed and informer.last_list.objects == 7
        assert {o["metadata"]["name"] for o in informer.list()} == names
        assert all("managedFields" not in o["metadata"] for o in informer.list())
        # The page observers see page_size objects at a time, before the store has any.
        assert batches == [(3, False, False), (3, False, False), (1, True, False)]

        # Changes come on the stream that carried the list: no second request.
        admin_rest.patch(CONFIGMAPS, "streamed-0", {"data": {"v": "2"}}, namespace)
        wait_for(lambda: informer.get(f"{namespace}/streamed-0")["data"]["v"] == "2", what="the change")
        assert informer.stats["watches"] == 1
        assert recorder.for_key(f"{namespace}/streamed-0") == [ADDED, MODIFIED]
        assert informer.resource_version == informer.get(f"{namespace}/streamed-0")["metadata"]["resourceVersion"]
    finally:
        informer.stop()


@pytest.mark.server
def test_an_apiserver_that_refuses_streamed_lists_is_listed_page_by_page() -> None:
    # An apiserver as Kubernetes 1.30, 1.31 and 1.33 ship it: the WatchList feature off (it answers 422).
    with _apiserver_with_configmaps(["--feature-gates=WatchList=false"], "paged", 5) as (rest, namespace):
        informer = _fill(rest, namespace, stream_lists=True, page_size=2)
        try:
            assert informer.stats["streamed"] == 0 and informer.stats["lists"] == 1 and informer.stats["errors"] == 0
            assert informer.last_list is not None and not informer.last_list.streamed
            assert informer.last_list.pages == 3 and len(informer) == 5
            rest.create(CONFIGMAPS, configmap("later", namespace))
            wait_for(lambda: informer.get(f"{namespace}/later") is not None, what="a watch event")
        finally:
            informer.stop()


@pytest.mark.server
def test_after_a_compaction_pages_come_from_etcd_and_the_streamed_list_from_the_cache() -> None:
    # An apiserver that compacts etcd every 2 s (5 min by default): the state of any cluster whose objects
    # have not changed for a while, reached in seconds.
    with _apiserver_with_configmaps(["--etcd-compaction-interval=2s"], "compacted", 20) as (rest, namespace):

        def paged_list_reads_etcd() -> bool:
            before = _fetched_from_etcd(rest, "configmaps")
            _fill(rest, namespace, stream_lists=False, page_size=5).stop()
            return _fetched_from_etcd(rest, "configmaps") - before >= 15  # the 3 pages after the first

        # The apiserver's cache drops its snapshots once etcd is compacted past them (its compactor polls
        # every 15 s); from then on a LIST's later pages are read from etcd.
        wait_for(paged_list_reads_etcd, timeout=90, interval=2, what="a paginated list served from etcd")

        before = _fetched_from_etcd(rest, "configmaps")
        informer = _fill(rest, namespace, stream_lists=True, page_size=5)
        try:
            assert informer.stats["streamed"] == 1 and len(informer) == 20
            # At most the one object of the consistent read's current-revision check: the 20 came from the cache.
            assert _fetched_from_etcd(rest, "configmaps") - before <= 1
        finally:
            informer.stop()


class _BrokenOnce(Informer):
    """Its first streamed list stops after 3 initial events: with a connection error (`raises`), or as a
    stream that just ends (a server that never sends the bookmark ending the initial events)."""

    def __init__(self, *args: Any, raises: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raises = raises
        self.broken = False

    def _receive_initial_events(self, lines: Iterator[bytes]) -> str:
        if not self.broken:
            self.broken = True
            lines = self._three_then_stop(lines)
        return super()._receive_initial_events(lines)

    def _three_then_stop(self, lines: Iterator[bytes]) -> Iterator[bytes]:
        for _ in range(3):
            yield next(lines)
        if self.raises:
            raise ConnectionResetError("the connection was cut mid-list")


@pytest.mark.parametrize("raises", [True, False], ids=["connection-cut", "stream-ends-early"])
def test_a_streamed_list_cut_short_leaves_the_store_untouched_and_is_listed_again(
    admin_rest: Rest, namespace: str, raises: bool
) -> None:
    """Nothing of a streamed list reaches the store or the handlers before its end: a cut one is listed again
    (streamed after a connection error; page by page after a stream that ended without the bookmark), and
    every object arrives once."""
    names = {f"cut-{n}" for n in range(8)}
    for name in names:
        admin_rest.create(CONFIGMAPS, configmap(name, namespace))
    informer = _BrokenOnce(admin_rest, CONFIGMAPS, namespace, raises=raises, backoff=Backoff(0.05, cap=0.2))
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    try:
        assert informer.wait_for_sync(20), informer.sync_problem()
        assert informer.broken and informer.stats["lists"] == 1
        assert {o["metadata"]["name"] for o in informer.list()} == names
        # Each object once, as ADDED: none from the attempt that was cut short.
        assert sorted((t, k) for t, k, _ in recorder.snapshot()) == sorted((ADDED, f"{namespace}/{n}") for n in names)
        if raises:  # an error: retried after the backoff, still streamed
            assert informer.stats["errors"] == 1 and informer.stats["streamed"] == 1
        else:  # no bookmark: this apiserver is taken not to stream lists
            assert informer.stats["errors"] == 0 and informer.stats["streamed"] == 0
            assert informer.last_list is not None and not informer.last_list.streamed
    finally:
        informer.stop()
