"""Informers against a real apiserver: they mirror the server's state through every kind of
interruption, and their indexes and events stay consistent with the store."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from domain.settings import Backoff
from harness import KubeControlPlane
from informers import ADDED, CONFIGMAPS, DELETED, MODIFIED, Informer, Rest, SharedInformers
from informers.heap import DEFERRED, caches_filling, caches_released
from informers.rest import WatchStream
from tests.runtime.support import WIDGETS, Recorder, configmap, widget
from tests.support.common import unique, wait_for


def _server_state(rest: Rest, namespace: str) -> dict[str, str]:
    items = rest.list(CONFIGMAPS, namespace)["items"]
    return {f"{namespace}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in items}


def _store_state(informer: Informer) -> dict[str, str]:
    return {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for o in informer.list()
    }


@pytest.fixture
def started() -> Iterator[list[Informer]]:
    informers: list[Informer] = []
    yield informers
    for informer in informers:
        informer.stop()


# -- mirroring ---------------------------------------------------------------------------------------


def test_sees_create_update_delete_in_order(admin_rest: Rest, namespace: str, started: list[Informer]) -> None:
    informer = Informer(admin_rest, CONFIGMAPS, namespace)
    recorder = Recorder()
    informer.add_handler(recorder)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    assert informer.list() == []

    key = f"{namespace}/one"
    admin_rest.create(CONFIGMAPS, configmap("one", namespace, {"v": "1"}))
    wait_for(lambda: informer.get(key), what="the created object")
    admin_rest.patch(CONFIGMAPS, "one", {"data": {"v": "2"}}, namespace)
    wait_for(lambda: informer.get(key)["data"]["v"] == "2", what="the update")
    admin_rest.delete(CONFIGMAPS, "one", namespace)
    wait_for(lambda: informer.get(key) is None, what="the deletion")

    assert recorder.for_key(key) == [ADDED, MODIFIED, DELETED]
    assert informer.stats["lists"] == 1


def test_objects_are_stored_without_managed_fields(admin_rest: Rest, namespace: str, started: list[Informer]) -> None:
    admin_rest.create(CONFIGMAPS, configmap("listed", namespace, {"v": "1"}))
    informer = Informer(admin_rest, CONFIGMAPS, namespace)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    admin_rest.create(CONFIGMAPS, configmap("watched", namespace, {"v": "1"}))
    wait_for(lambda: len(informer) == 2)
    server = admin_rest.get(CONFIGMAPS, "listed", namespace)
    assert server["metadata"].get("managedFields"), "the server does send managedFields"
    for obj in informer.list():
        assert "managedFields" not in obj["metadata"]
        assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1"


def test_a_new_informer_catches_up_on_many_changes(admin_rest: Rest, namespace: str, started: list[Informer]) -> None:
    """60 objects created, 20 updated, 10 deleted before the informer exists: it lists them all
    (paginated: page size 7)."""
    for i in range(60):
        admin_rest.create(CONFIGMAPS, configmap(f"cm-{i:02d}", namespace, {"v": "0"}))
    for i in range(20):
        admin_rest.patch(CONFIGMAPS, f"cm-{i:02d}", {"data": {"v": "1"}}, namespace)
    for i in range(50, 60):
        admin_rest.delete(CONFIGMAPS, f"cm-{i:02d}", namespace)

    informer = Informer(admin_rest, CONFIGMAPS, namespace, page_size=7)
    recorder = Recorder()
    informer.add_handler(recorder)
    started.append(informer.start())
    assert informer.wait_for_sync(10)

    assert _store_state(informer) == _server_state(admin_rest, namespace)
    assert len(informer) == 50
    assert sum(1 for o in informer.list() if o["data"]["v"] == "1") == 20
    assert [t for t, _, _ in recorder.snapshot()] == [ADDED] * 50


def test_a_late_handler_is_replayed_the_current_objects(
    admin_rest: Rest, namespace: str, started: list[Informer]
) -> None:
    for name in ("a", "b"):
        admin_rest.create(CONFIGMAPS, configmap(name, namespace))
    informer = Informer(admin_rest, CONFIGMAPS, namespace)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    recorder = Recorder()
    informer.add_handler(recorder)
    assert sorted(recorder.snapshot()) == sorted(
        (ADDED, k, rv) for k, rv in _server_state(admin_rest, namespace).items()
    )


# -- interruptions -----------------------------------------------------------------------------------


def test_bookmarks_advance_the_resource_version_and_break_nothing(
    kube: KubeControlPlane, admin_rest: Rest, namespace: str, started: list[Informer]
) -> None:
    """The watch cache sends a BOOKMARK shortly before a watch times out when other objects of
    the kind changed meanwhile. The informer takes its resourceVersion, emits no event, and
    resumes from it without relisting."""
    other = unique("rt-noise")
    kube.ensure_namespace(other)
    admin_rest.create(CONFIGMAPS, configmap("mine", namespace, {"v": "1"}))
    informer = Informer(admin_rest, CONFIGMAPS, namespace, watch_timeout=(5, 5))
    recorder = Recorder()
    informer.add_handler(recorder)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    listed_rv = int(informer.resource_version or 0)

    stop_noise = threading.Event()

    def noise() -> None:
        i = 0
        while not stop_noise.is_set():
            admin_rest.create(CONFIGMAPS, configmap(f"noise-{i}", other))
            i += 1
            stop_noise.wait(0.3)

    thread = threading.Thread(target=noise, daemon=True)
    thread.start()
    try:
        wait_for(lambda: informer.stats["bookmarks"] >= 1, timeout=20, interval=0.1, what="a bookmark")
        wait_for(lambda: informer.stats["watches"] >= 2, timeout=20, interval=0.1, what="the watch to resume")
    finally:
        stop_noise.set()
        thread.join()

    assert int(informer.resource_version or 0) > listed_rv
    assert informer.stats["lists"] == 1 and informer.stats["gone"] == 0 and informer.stats["errors"] == 0
    assert [t for t, _, _ in recorder.snapshot()] == [ADDED]
    admin_rest.patch(CONFIGMAPS, "mine", {"data": {"v": "2"}}, namespace)
    wait_for(lambda: informer.get(f"{namespace}/mine")["data"]["v"] == "2", what="an update after bookmarks")
    assert recorder.for_key(f"{namespace}/mine") == [ADDED, MODIFIED]


class _PausedInformer(Informer):
    """Drops its first watch (the stream of a streamed list, once the store is filled) and waits until
    released, so the world can move on (and be compacted) before it watches from the listed version."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.paused = threading.Event()
        self.release = threading.Event()

    def _follow(self, stream: WatchStream, lines: Iterator[bytes], resource_version: str) -> str:
        if not self.release.is_set():
            self._close_stream(stream)
            self.paused.set()
            self.release.wait()
            return resource_version
        return super()._follow(stream, lines, resource_version)


@pytest.fixture(scope="module")
def compacting_kube() -> Iterator[KubeControlPlane]:
    """A dedicated apiserver that compacts etcd every second and serves watches from etcd
    directly (no watch cache), so an old resourceVersion really expires (410 Gone)."""
    with KubeControlPlane(extra_args=["--etcd-compaction-interval=1s", "--watch-cache=false"]) as control_plane:
        yield control_plane


def _watch_status(rest: Rest, namespace: str, resource_version: str) -> int | None:
    """What a watch from resource_version answers now: 410 once compacted, else None."""
    stream = rest.stream(
        CONFIGMAPS.collection_path(namespace),
        query=[("watch", "1"), ("resourceVersion", resource_version), ("timeoutSeconds", "1")],
        timeout=(5, 10),
    )
    try:
        import json

        for line in stream.lines():
            event = json.loads(line)
            if event["type"] == "ERROR":
                return event["object"].get("code")
        return None
    finally:
        stream.close()


def _wait_compacted_past(rest: Rest, namespace: str, resource_version: str) -> None:
    """Until etcd has compacted resource_version away: a watch from it answers 410 Gone."""
    wait_for(
        lambda: _watch_status(rest, namespace, resource_version) == 410,
        timeout=30,
        interval=0.5,
        what="etcd to compact the listed resourceVersion",
    )


def test_410_gone_relists_without_losing_or_duplicating_state(compacting_kube: KubeControlPlane) -> None:
    with compacting_kube.admin_client() as api:
        rest = Rest(api)
        namespace = unique("rt-gone")
        compacting_kube.ensure_namespace(namespace)
        for name in ("keep", "change", "remove"):
            rest.create(CONFIGMAPS, configmap(name, namespace, {"v": "1"}))

        informer = _PausedInformer(rest, CONFIGMAPS, namespace)
        recorder = Recorder()
        informer.add_handler(recorder)
        informer.start()
        try:
            assert informer.wait_for_sync(10)
            assert informer.paused.wait(10)
            listed_rv = informer.resource_version
            assert listed_rv is not None

            # While the informer is away: change, delete and create, then wait for compaction.
            rest.patch(CONFIGMAPS, "change", {"data": {"v": "2"}}, namespace)
            rest.delete(CONFIGMAPS, "remove", namespace)
            rest.create(CONFIGMAPS, configmap("new", namespace, {"v": "1"}))
            _wait_compacted_past(rest, namespace, listed_rv)

            informer.release.set()
            wait_for(lambda: informer.stats["gone"] >= 1 and informer.stats["lists"] >= 2, what="the relist")
            assert _store_state(informer) == _server_state(rest, namespace)

            # Exactly one event per change: nothing lost, nothing twice.
            events = recorder.snapshot()[3:]
            assert sorted((t, k) for t, k, _ in events) == sorted(
                [(MODIFIED, f"{namespace}/change"), (DELETED, f"{namespace}/remove"), (ADDED, f"{namespace}/new")]
            )
            # And it watches on from the new list.
            rest.patch(CONFIGMAPS, "keep", {"data": {"v": "3"}}, namespace)
            wait_for(lambda: informer.get(f"{namespace}/keep")["data"]["v"] == "3", what="a change after the relist")
            assert recorder.for_key(f"{namespace}/keep") == [ADDED, MODIFIED]
            assert informer.stats["gone"] == 1
        finally:
            informer.release.set()
            informer.stop()


class _RelistingInformer(Informer):
    """After each list it waits (the watch closed) until released, then watches on from the version it listed.
    Once etcd is compacted past that version: a real 410 Gone (an ERROR event on that watch), and a relist."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused = threading.Event()
        self.release = threading.Event()
        self._released = False

    def _follow(self, stream: WatchStream, lines: Iterator[bytes], resource_version: str) -> str:
        if self._released:  # the watch from the listed version: its 410 ends it
            self._released = False
            return super()._follow(stream, lines, resource_version)
        self._close_stream(stream)
        self.paused.set()
        self.release.wait()
        self.release.clear()
        self._released = True
        return resource_version


def _relist_after_a_410(informer: _RelistingInformer, rest: Rest, namespace: str) -> None:
    """Let the paused informer watch on from its listed version once etcd has compacted it away (a write to the
    namespace first: the compaction must pass it); return when its relist is done and it pauses again."""
    assert informer.paused.wait(10)
    informer.paused.clear()
    listed = informer.resource_version
    assert listed is not None
    lists, gone = informer.stats["lists"], informer.stats["gone"]
    rest.create(CONFIGMAPS, configmap(unique("later"), namespace))
    _wait_compacted_past(rest, namespace, listed)
    informer.release.set()
    wait_for(lambda: informer.stats["lists"] > lists and informer.paused.is_set(), what="the relist")
    assert informer.stats["gone"] == gone + 1  # relisted because of the 410, nothing else


@pytest.mark.parametrize("stream_lists", [False, True], ids=["paged", "streamed"])
def test_a_relist_after_a_410_runs_without_full_collections_and_restores_them(
    compacting_kube: KubeControlPlane, stream_lists: bool
) -> None:
    """At 100,000 objects a relist ran many full collections, each one stopping every thread (the API's too) while
    it walked the heap. Now none runs while it lists, one after it, and the thresholds are as they were."""
    with compacting_kube.admin_client() as api:
        rest = Rest(api)
        namespace = unique("rt-gc")
        compacting_kube.ensure_namespace(namespace)
        for i in range(20):
            rest.create(CONFIGMAPS, configmap(f"cm-{i}", namespace, {"v": "1"}))
        thresholds = gc.get_threshold()
        relisting = threading.Event()
        during: list[tuple[int, int, int]] = []  # the thresholds at each page of the relist
        full: list[str] = []  # when each full collection ran: "relist" (while its pages came in) or "other"

        paging = threading.Event()

        def observe(objects: list[Any], last: bool) -> None:
            if not relisting.is_set():
                return
            paging.set()
            during.append(gc.get_threshold())
            # As many new survivors as a large relist's: enough for CPython to run a full collection (it does once
            # the survivors since the last one are a quarter of those it kept then).
            kept = [[i] for i in range(len(gc.get_objects()) // 2 + 100_000)]
            during.append(gc.get_threshold())
            del kept
            paging.clear()

        def collections(phase: str, info: dict[str, int]) -> None:
            if phase == "start" and info["generation"] == 2:
                full.append("relist" if paging.is_set() else "other")

        informer = _RelistingInformer(rest, CONFIGMAPS, namespace, stream_lists=stream_lists)
        informer.add_page_observer(observe)
        gc.callbacks.append(collections)
        try:
            informer.start()
            assert informer.wait_for_sync(10)
            relisting.set()
            rest.patch(CONFIGMAPS, "cm-0", {"data": {"v": "2"}}, namespace)
            _relist_after_a_410(informer, rest, namespace)
            relisting.clear()
            assert (informer.stats["streamed"] > 0) is stream_lists  # the way asked for is the way it listed
            assert during and "relist" not in full, full  # not one full collection while its pages came in
            assert set(during) == {(thresholds[0], thresholds[1], DEFERRED)}
            assert gc.get_threshold() == thresholds  # back once it was done
            assert informer.get(f"{namespace}/cm-0")["data"]["v"] == "2"
        finally:
            gc.callbacks.remove(collections)
            informer.release.set()
            informer.stop()
            informer.release.set()
            caches_released()
        assert gc.get_threshold() == thresholds


class _Cycle:
    """Cyclic garbage (a request's objects in another thread, a traceback): only a full collection frees it."""

    def __init__(self) -> None:
        self.me = self
        self.padding = [[i] for i in range(1000)]


def test_repeated_relists_free_the_replaced_caches_and_freeze_no_garbage(compacting_kube: KubeControlPlane) -> None:
    """The caches are frozen once filled. A relist replaces them: the old objects must still be freed (reference
    counting frees frozen objects too), and what the relist froze must not be garbage, which nothing would ever
    free again: the frozen objects stay as many from one relist to the next."""
    with compacting_kube.admin_client() as api:
        rest = Rest(api)
        namespace = unique("rt-frozen")
        compacting_kube.ensure_namespace(namespace)
        names = [f"cm-{i}" for i in range(100)]
        for name in names:
            rest.create(CONFIGMAPS, configmap(name, namespace, {"v": "0" * 1000}))
        relisting = threading.Event()
        garbage: list[weakref.ref[_Cycle]] = []

        def observe(objects: list[Any], last: bool) -> None:
            if relisting.is_set():
                cycle = _Cycle()
                garbage.append(weakref.ref(cycle))
                gc.collect(1)  # it outlives the young collections, as a request that takes a while
                del cycle  # now garbage that waits for a full collection

        informer = _RelistingInformer(rest, CONFIGMAPS, namespace)
        informer.add_page_observer(observe)
        frozen: list[int] = []
        try:
            with caches_filling():  # as the manager's start: the filled cache is frozen
                informer.start()
                assert informer.wait_for_sync(10)
            relisting.set()
            for round_ in range(1, 5):
                for name in names:  # every object changes: the relist replaces every frozen one
                    rest.patch(CONFIGMAPS, name, {"data": {"v": str(round_) * 1000}}, namespace)
                _relist_after_a_410(informer, rest, namespace)
                assert informer.get(f"{namespace}/cm-0")["data"]["v"] == str(round_) * 1000
                frozen.append(gc.get_freeze_count())
            relisting.clear()
            gc.collect()  # a full collection, the frozen objects left alone
            assert len(garbage) >= 4 and not [ref for ref in garbage if ref() is not None]
            # 100 objects of 1,000 characters replaced each time; a frozen cycle would add 1,000 lists a relist.
            assert frozen[-1] - frozen[0] < 500, frozen
        finally:
            informer.release.set()
            informer.stop()
            informer.release.set()
            caches_released()


def test_errors_back_off_and_relist_until_permitted(
    kube: KubeControlPlane, admin_rest: Rest, namespace: str, started: list[Informer]
) -> None:
    """A forbidden list (403) is retried with backoff; once RBAC allows it the informer syncs."""
    admin_rest.create(CONFIGMAPS, configmap("visible", namespace))
    user = unique("rt-reader")
    with kube.client_as(user) as api:
        informer = Informer(api, CONFIGMAPS, namespace, backoff=Backoff(0.05, cap=0.2))
        started.append(informer.start())
        wait_for(lambda: informer.stats["errors"] >= 2, what="repeated 403s")
        assert not informer.has_synced()
        assert isinstance(informer.last_error, ApiException) and informer.last_error.status == 403

        with kube.admin_client() as admin:
            rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
            rbac.create_namespaced_role(
                namespace,
                {
                    "metadata": {"name": "cm-reader"},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
                },
            )
            rbac.create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {"name": "cm-reader"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
                    "subjects": [{"kind": "User", "name": user}],
                },
            )
        assert informer.wait_for_sync(10)
        assert list(_store_state(informer)) == [f"{namespace}/visible"]


# -- indexes -----------------------------------------------------------------------------------------


def _by_shard(obj: dict) -> list[str]:
    shard = (obj.get("status") or {}).get("shard")
    return [shard] if shard else []


def _by_consumer(obj: dict) -> list[str]:
    return [obj["spec"]["consumer"]]


def test_indexes_follow_updates_and_deletes(
    admin_rest: Rest, namespace: str, widgets_crd: None, started: list[Informer]
) -> None:
    """Database-like objects indexed by shard (a status field, set later) and by consumer."""
    informer = Informer(admin_rest, WIDGETS, namespace)
    informer.add_index("shard", _by_shard)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    informer.add_index("consumer", _by_consumer)  # added after start: indexes what is stored

    for i, consumer in enumerate(["c1", "c1", "c2"]):
        admin_rest.create(WIDGETS, widget(f"db{i}", namespace, {"consumer": consumer}))
    wait_for(lambda: len(informer) == 3)
    assert {o["metadata"]["name"] for o in informer.by_index("consumer", "c1")} == {"db0", "db1"}
    assert informer.by_index("shard", "s1") == []

    for name, shard in (("db0", "s1"), ("db1", "s1"), ("db2", "s2")):
        admin_rest.patch(WIDGETS, name, {"status": {"shard": shard}}, namespace, subresource="status")
    wait_for(lambda: informer.count_by_index("shard", "s1") == 2 and informer.count_by_index("shard", "s2") == 1)

    admin_rest.patch(WIDGETS, "db1", {"status": {"shard": "s2"}}, namespace, subresource="status")
    wait_for(lambda: informer.count_by_index("shard", "s2") == 2)
    assert informer.index_keys("shard", "s1") == [f"{namespace}/db0"]

    admin_rest.delete(WIDGETS, "db0", namespace)
    wait_for(lambda: informer.count_by_index("shard", "s1") == 0)
    assert "s1" not in informer.index_values("shard")
    assert {o["metadata"]["name"] for o in informer.by_index("consumer", "c1")} == {"db1"}
    assert sorted(informer.index_values("consumer")) == ["c1", "c2"]

    with pytest.raises(ValueError):
        informer.add_index("shard", _by_consumer)
    informer.add_index("shard", _by_shard)  # the same function again is fine


# -- sharing -----------------------------------------------------------------------------------------


def test_shared_informers_hand_out_one_informer_per_resource(
    admin_rest: Rest, namespace: str, widgets_crd: None
) -> None:
    shared = SharedInformers(admin_rest)
    try:
        first = shared.informer(CONFIGMAPS, namespace)
        assert shared.informer(CONFIGMAPS, namespace) is first
        assert shared.informer(CONFIGMAPS, "elsewhere") is not first
        shared.start()
        late = shared.informer(WIDGETS, namespace)  # created after start: started at once
        assert shared.wait_for_sync(10)
        assert late.has_synced() and shared.has_synced()
    finally:
        shared.stop()
    assert all(informer.stopped for informer in shared.all())
    with pytest.raises(RuntimeError):
        shared.informer(CONFIGMAPS, namespace)


def test_stop_returns_promptly_from_an_idle_watch(admin_rest: Rest, namespace: str) -> None:
    informer = Informer(admin_rest, CONFIGMAPS, namespace).start()
    assert informer.wait_for_sync(10)
    wait_for(lambda: informer.stats["watches"] == 1)
    import time

    started = time.monotonic()
    informer.stop(timeout=5)
    assert time.monotonic() - started < 2
    assert informer._thread is not None and not informer._thread.is_alive()


def test_a_long_list_that_keeps_making_progress_is_waited_for(admin_rest: Rest, namespace: str) -> None:
    """The start waits for a big list as long as its pages keep coming (a fleet of 100,000 objects lists
    longer than the stall timeout in all), and gives up only on a list that makes no progress."""
    import time

    for n in range(300):
        admin_rest.create(CONFIGMAPS, configmap(f"page-{n}", namespace))

    def list_once(stall_timeout: float) -> tuple[bool, float]:
        # 300 pages of a LIST, as from an apiserver that does not stream lists (a streamed list of 300 small
        # objects is over in milliseconds; it counts progress per `page_size` objects the same way).
        shared = SharedInformers(admin_rest, page_size=1, stream_lists=False)
        try:
            shared.informer(CONFIGMAPS, namespace)
            started = time.monotonic()
            shared.start()
            return shared.wait_until_synced(stall_timeout), time.monotonic() - started
        finally:
            shared.stop()

    synced, whole = list_once(stall_timeout=60)
    assert synced
    # A quarter of the whole list's time: far longer than one page, far shorter than all of them.
    synced, again = list_once(stall_timeout=whole / 4)
    assert synced, f"gave up on a list that was making progress ({again:.2f} s, stall {whole / 4:.2f} s)"


def test_page_observers_see_every_page_before_the_store_and_a_failing_one_stops_nothing(
    admin_rest: Rest, namespace: str, started: list[Informer]
) -> None:
    """A start looks at each page of a large list as it arrives (reconciler/database/early.py), before the store
    holds that page (it holds the pages before it: a list goes into the store page by page, never held twice);
    has_synced still waits for the whole list."""
    names = {f"observed-{n}" for n in range(7)}
    for name in names:
        admin_rest.create(CONFIGMAPS, configmap(name, namespace))
    informer = Informer(admin_rest, CONFIGMAPS, namespace, page_size=3)
    pages: list[tuple[list[str], bool, bool, int]] = []

    def observer(objects: list[dict[str, object]], last: bool) -> None:
        seen = [str(o["metadata"]["name"]) for o in objects]  # type: ignore[index]
        pages.append((seen, last, informer.has_synced(), len(informer)))

    def broken(objects: list[dict[str, object]], last: bool) -> None:
        raise RuntimeError("a bug in an observer")

    informer.add_page_observer(broken)
    informer.add_page_observer(observer)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    assert [len(p[0]) for p in pages] == [3, 3, 1]
    assert {name for p in pages for name in p[0]} == names
    assert [p[1] for p in pages] == [False, False, True]  # `last` on the last page only
    assert [(synced, stored) for _, _, synced, stored in pages] == [(False, 0), (False, 3), (False, 6)]
    assert {o["metadata"]["name"] for o in informer.list()} == names


def test_synced_means_the_handlers_have_seen_the_first_list(
    admin_rest: Rest, namespace: str, started: list[Informer]
) -> None:
    """A controller starts on "synced" and resyncs every key itself: the first list's ADDED events must all
    have been handled by then (as client-go orders it), or 100,000 of them reach its queue a second time."""
    for n in range(50):
        admin_rest.create(CONFIGMAPS, configmap(f"synced-{n}", namespace))
    informer = Informer(admin_rest, CONFIGMAPS, namespace, page_size=7)
    informer.add_handler(lambda *event: time.sleep(0.01))  # a handler that takes its time (e.g. a busy queue)
    recorder = Recorder()
    informer.add_handler(recorder)
    started.append(informer.start())
    assert informer.wait_for_sync(10)
    events = recorder.snapshot()  # no waiting: synced already says they are in
    assert len(events) == 50 and {t for t, _, _ in events} == {ADDED}
