"""A list+watch cache of one resource, objects kept as plain dicts.

Behaviour, in the order a reader needs it:
- The store is filled by a streamed list: one WATCH with `sendInitialEvents` (the apiserver's "watch
  list", client-go's WatchListClient) sends every current object as an ADDED event from the apiserver's
  watch cache and then a bookmark marked `k8s.io/initial-events-end`; the store is replaced then, as
  after a LIST, and the same stream goes on as the watch. Unlike a paginated LIST it needs no snapshot
  of the cache for its later pages: after an etcd compaction (every 5 minutes) the apiserver serves
  the pages of a LIST from etcd, decoding every object again (3x its CPU at 100,000 Databases).
- An apiserver that refuses the streamed list (422: the WatchList feature is off, the default of
  Kubernetes 1.30, 1.31 and 1.33) or ends the stream before its initial events did is listed page by page from then on
  (`stream_lists=False` asks for that from the start). The next page is asked for while one is decoded
  and stored. `last_list` says where the list's time went, either way.
- The store is kept current by a WATCH from the list's resourceVersion with `allowWatchBookmarks`
  (bookmarks only advance the resourceVersion).
- A watch that ends normally (server timeout) is resumed from the last resourceVersion seen.
- 410 Gone (an expired resourceVersion, as an ERROR event or as the HTTP status) relists at once:
  the client's `kubernetes.watch.Watch` retries a 410 only once and then raises, so it is not used.
- Any other error (network, 403, 5xx, a broken stream) relists after an exponential backoff.
- A list (the first or a relist) goes into the store page by page, replacing each key's object as
  its page comes (so the process never holds the old store and a whole new list at once): new keys
  produce ADDED, changed ones (another resourceVersion) MODIFIED, unchanged ones nothing (the stored
  object stays); once the list is in, the keys it did not show produce DELETED. Watch events whose
  resourceVersion equals the stored one are dropped. So handlers never see an object twice nor miss
  a deletion across reconnects.
- Every list, the first and each relist, runs with the cycle collector's full collections deferred
  (`informers.heap.listing`): a relist of changed objects, or of pages, otherwise runs many of them, each
  stopping every thread of the process (the API's too), right when the apiserver was just degraded
  (docs/performance.md section 5).
- `add_page_observer` sees each page of a full LIST (`page_size` objects of a streamed one) as it arrives,
  before the store has it (a start can look at 100,000 objects while the rest of the list is still on its
  way); `has_synced` changes only once the whole list is in.
- Stored objects are shared, read-only dicts (no copies: 100,000 Databases must fit in memory).
  `metadata.managedFields` is dropped before storing; `transform` keeps less (SharedInformers passes
  each kind's domain.cached form).
- `metadata_only` lists and watches PartialObjectMetadata (the apiserver sends no spec, status or
  data) and keeps only each object's name, namespace, uid and resourceVersion: annotations are
  dropped too, since `kubectl apply` copies a whole Secret, data included, into one.
"""

from __future__ import annotations

import builtins
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from domain.objects import Obj
from domain.settings import SETTINGS, Backoff
from informers.heap import listing
from informers.resource import Resource, object_key
from informers.rest import METADATA_ACCEPT, METADATA_LIST_ACCEPT, Rest, WatchStream, decode_json

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

Handler = Callable[[str, Obj | None, Obj | None], None]
IndexFunc = Callable[[Obj], Iterable[str]]
Transform = Callable[[Obj], Obj]
PageObserver = Callable[[list[Obj], bool], None]

# The annotation of the bookmark that ends a streamed list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def strip_managed_fields(obj: Obj) -> Obj:
    """The default transform: drop `metadata.managedFields` (often the biggest part of an object)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


_IDENTITY = ("name", "namespace", "uid", "resourceVersion")


def keep_identity(obj: Obj) -> Obj:
    """The transform of a metadata-only informer: the object's identity and version, nothing else."""
    metadata = obj.get("metadata") or {}
    return {"metadata": {k: metadata[k] for k in _IDENTITY if k in metadata}}


def resource_version_of(obj: Obj) -> str | None:
    version: str | None = obj.get("metadata", {}).get("resourceVersion")
    return version


class ListTiming:
    """Where the last full LIST's time went: waiting for the apiserver's pages (request to the last byte),
    decoding them, storing (preparing the objects, replacing the store, dispatching its events), and the
    page observers."""

    def __init__(self, streamed: bool = False) -> None:
        self.objects = self.pages = 0
        self.streamed = streamed
        self.spent = dict.fromkeys(("waiting", "decoding", "storing", "observing"), 0.0)

    def page(self, waiting: float, decoding: float, storing: float, observing: float = 0.0) -> None:
        self.pages += 1
        for part, seconds in zip(self.spent, (waiting, decoding, storing, observing), strict=True):
            self.spent[part] += seconds

    def describe(self) -> str:
        spent = self.spent
        how = "streamed in" if self.streamed else "in"
        return (
            f"{self.objects} {how} {self.pages} pages, {sum(spent.values()):.1f}s: {spent['waiting']:.1f}s waiting "
            f"for the apiserver, {spent['decoding']:.1f}s decoding, {spent['storing']:.1f}s storing, "
            f"{spent['observing']:.1f}s observing"
        )


class PageRequest:
    """One LIST page asked for in a thread of its own (a daemon: a stopping process does not wait for it)."""

    def __init__(self, fetch: Callable[[], bytes], name: str) -> None:
        self._data = b""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fetch,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fetch: Callable[[], bytes]) -> None:
        try:
            self._data = fetch()
        except BaseException as exc:  # noqa: BLE001 - raised in the informer's thread by result()
            self._error = exc

    def result(self) -> bytes:
        """The page (the request has its own timeout), or the request's error."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._data


_CONTINUE = re.compile(rb'"continue":"([A-Za-z0-9_=+/-]*)"')
_HEAD = 4096  # a built-in type's list writes its metadata before its items, within the first bytes
_TAIL = 4096  # a custom resource's list (keys sorted: apiVersion, items, kind, metadata) writes it last
_ITEMS_FIRST = re.compile(rb'\{"apiVersion":"[^"]*","items":\[')
_LIST_METADATA = b'List","metadata":{'  # after the list's kind (DatabaseList), as the last key


def continue_token_of(page: bytes) -> str | None:
    """The continue token of an undecoded LIST page, read from its metadata; None when it is not found
    (the last page, or a layout not known here: the caller decodes first). A built-in type's list (kind,
    apiVersion, metadata, items) has the metadata in its first bytes; a custom resource's list (Databases:
    the apiserver writes unstructured objects with sorted keys) has it as its last key, after every item
    and right after the list's kind: a flat object (no `{` in it) at the page's end, none of anyone's."""
    head = page[:_HEAD]
    if _ITEMS_FIRST.match(head):
        tail = page[-_TAIL:]
        start = tail.rfind(_LIST_METADATA)
        metadata = tail[start + len(_LIST_METADATA) :] if start >= 0 else b"{"
        found = _CONTINUE.search(metadata) if b"{" not in metadata else None
    else:
        items = head.find(b'"items":')
        if items < 0:
            return None
        found = _CONTINUE.search(head, 0, items)
    return found.group(1).decode("ascii") if found and found.group(1) else None


class Listed:
    """The keys a list has stored so far, for the keys it did not show (deleted) once it is in. A list into an
    empty store (a start's) only counts them: nothing can be missing then, and a set of every key of the fleet
    would be held beside the store while the caches fill."""

    def __init__(self, track: bool) -> None:
        self.count = 0
        self._keys: set[str] | None = set() if track else None

    def add(self, key: str) -> None:
        self.count += 1
        if self._keys is not None:
            self._keys.add(key)

    def missing(self, stored: Iterable[str]) -> builtins.list[str]:
        """The stored keys this list did not show."""
        return [] if self._keys is None else [key for key in stored if key not in self._keys]


class StreamRefused(Exception):
    """The apiserver does not stream lists (an older or differently configured one): list page by page."""


class GoneError(Exception):
    """The resourceVersion we watch from has expired (HTTP 410): relist."""


class Informer:
    """List+watch cache of one resource (optionally one namespace) with indexes and event handlers.

    Handlers are called as `handler(event_type, old, new)` with event_type ADDED (old None),
    MODIFIED or DELETED (new None), from the informer's thread, after the store was updated.
    They must be quick (enqueue a key) and must not mutate the objects. Events are hints for
    level-based reconcilers: read the current state from the store, never act on the event type.
    """

    def __init__(
        self,
        api_client: ApiClient | Rest,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        transform: Transform | None = strip_managed_fields,
        page_size: int = SETTINGS.watch.list_page_size,
        stream_lists: bool = SETTINGS.watch.stream_lists,
        watch_timeout: tuple[int, int] = SETTINGS.watch.watch_timeout,
        backoff: Backoff = SETTINGS.watch.relist,
        request_timeout: tuple[float, float] = SETTINGS.watch.request_timeout,
    ) -> None:
        self.rest = api_client if isinstance(api_client, Rest) else Rest(api_client)
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.metadata_only = metadata_only
        self._transform = keep_identity if metadata_only else transform
        self._accept = (METADATA_LIST_ACCEPT, METADATA_ACCEPT) if metadata_only else (None, None)
        self._page_size = page_size
        self._stream_lists = stream_lists
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._request_timeout = request_timeout

        self._lock = threading.RLock()  # store and indexes
        self._dispatch_lock = threading.RLock()  # handler list and event order
        # The store and the indexes are keyed by each object's own name string in an informer of one namespace
        # (a "namespace/name" key is one more string per object: 100,000 of them per kind), by object_key
        # otherwise; the methods take and give "namespace/name" keys all the same.
        self._prefix = f"{namespace}/" if namespace else ""
        self._items: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._handlers: list[Handler] = []
        self._page_observers: list[PageObserver] = []

        self._synced = threading.Event()
        self.progressed = time.monotonic()  # when the last LIST page arrived (or the informer was made)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._stream_lock = threading.Lock()
        self._progress = False
        self.resource_version: str | None = None
        self.last_error: BaseException | None = None
        self.stats = {"lists": 0, "streamed": 0, "watches": 0, "events": 0, "bookmarks": 0, "gone": 0, "errors": 0}
        self.last_list: ListTiming | None = None

    def __repr__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        what = " (metadata)" if self.metadata_only else ""
        return f"<Informer {self.resource}{what}{where}>"

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Informer:
        if self._thread is not None:
            return self
        self.progressed = time.monotonic()  # registered long before the start is not stalled
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.resource.plural}", daemon=True)
        self._thread.start()
        return self

    def signal_stop(self) -> None:
        """Ask the informer to stop (aborts the open watch) without waiting."""
        self._stop.set()
        with self._stream_lock:
            if self._stream is not None:
                self._stream.abort()

    def stop(self, timeout: float | None = 10.0) -> None:
        self.signal_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def has_synced(self) -> bool:
        """True once the first LIST has been stored and its events handled (and stays true across relists)."""
        return self._synced.is_set()

    def sync_problem(self) -> str:
        """Why the store has not synced, in words for an operator (the last list error, with a hint)."""
        exc = self.last_error
        if exc is None:
            return "no answer from the apiserver yet"
        status = exc.status if isinstance(exc, ApiException) else None
        if status == 404:
            return "HTTP 404: the apiserver does not serve this resource (is its CustomResourceDefinition installed?)"
        if status in (401, 403):
            return f"HTTP {status}: not allowed to list and watch it (check the ServiceAccount's RBAC)"
        return _describe(exc)

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    # -- reading ---------------------------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        """The object stored under "namespace/name" (or "name"); shared, do not mutate."""
        local = self._local(key)
        if local is None:
            return None
        with self._lock:
            return self._items.get(local)

    def list(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        with self._lock:
            return [self._prefix + key for key in self._items] if self._prefix else list(self._items)

    def _key(self, obj: Obj) -> str:
        """The store's key of `obj`: its name (the object's own string) in an informer of one namespace."""
        if self._prefix:
            name: str = obj["metadata"]["name"]
            return name
        return object_key(obj)

    def _local(self, key: str) -> str | None:
        """The store's key for the "namespace/name" key `key` (None: not of this informer's namespace)."""
        if not self._prefix:
            return key
        return key[len(self._prefix) :] if key.startswith(self._prefix) else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- indexes ---------------------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Register index `name`: fn(obj) returns the values obj is found under (may be empty).

        Registering the same function twice is a no-op; another function under a taken name is
        an error. Indexes may be added before or after start (existing objects are indexed).
        """
        with self._lock:
            existing = self._indexers.get(name)
            if existing is fn:
                return
            if existing is not None:
                raise ValueError(f"index {name!r} is already registered on {self!r}")
            self._indexers[name] = fn
            index: dict[str, set[str]] = {}
            for key, obj in self._items.items():
                for value in self._index_values(name, fn, obj):
                    index.setdefault(value, set()).add(key)
            self._indices[name] = index

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        """Objects whose index `name` yields `value` (shared, do not mutate)."""
        with self._lock:
            keys = self._index(name).get(value, ())
            return [self._items[k] for k in keys]

    def index_keys(self, name: str, value: str) -> builtins.list[str]:
        with self._lock:
            return [self._prefix + key for key in self._index(name).get(value, ())]

    def count_by_index(self, name: str, value: str) -> int:
        with self._lock:
            return len(self._index(name).get(value, ()))

    def index_values(self, name: str) -> builtins.list[str]:
        """Every value index `name` currently holds (e.g. every shard that has databases)."""
        with self._lock:
            return list(self._index(name))

    def _index(self, name: str) -> dict[str, set[str]]:
        try:
            return self._indices[name]
        except KeyError:
            raise KeyError(f"no index {name!r} on {self!r}") from None

    def _index_values(self, name: str, fn: IndexFunc, obj: Obj) -> set[str]:
        try:
            return {v for v in fn(obj) if v is not None}
        except Exception:  # a broken index function must not kill the informer
            log.exception("index %r failed on %s %s", name, self.resource, object_key(obj))
            return set()

    def _reindex(self, key: str, old: Obj | None, new: Obj | None) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            before = self._index_values(name, fn, old) if old is not None else set()
            after = self._index_values(name, fn, new) if new is not None else set()
            for value in before - after:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
            for value in after - before:
                index.setdefault(value, set()).add(key)

    # -- handlers --------------------------------------------------------------------------------

    def add_handler(self, handler: Handler, *, replay: bool = True) -> Handler:
        """Call `handler(event_type, old, new)` on every change; with `replay`, first ADDED for
        every object already stored (so a late handler misses nothing). Returns the handler.

        Atomic with respect to changes: the handler gets events exactly for the changes after the
        store state it was registered (and replayed) at."""
        with self._dispatch_lock:
            self._handlers.append(handler)
            if replay:
                for obj in self.list():
                    self._call(handler, ADDED, None, obj)
        return handler

    def add_page_observer(self, observer: PageObserver) -> None:
        """Call `observer(objects, last)` from the informer's thread with each page of every full LIST (the
        first and each relist), the objects as the store will hold them, before it holds them; `last` on the
        list's last page. The list is one snapshot: what an observer concludes about a page's objects holds
        until a watch event changes them (after the store has them). An observer must not mutate them; one
        that raises is logged and the list goes on. Register before `start()` to see the first list."""
        with self._dispatch_lock:
            self._page_observers.append(observer)

    def _observe(self, objects: builtins.list[Obj], last: bool) -> None:
        for observer in list(self._page_observers):
            try:
                observer(objects, last)
            except Exception:  # an observer is an optimisation: the list must go on
                log.exception("page observer %r failed for %s", observer, self.resource)

    def remove_handler(self, handler: Handler) -> None:
        with self._dispatch_lock:
            self._handlers.remove(handler)

    def _call(self, handler: Handler, event_type: str, old: Obj | None, new: Obj | None) -> None:
        try:
            handler(event_type, old, new)
        except Exception:  # one broken handler must not stop the others
            log.exception("event handler %r failed for %s", handler, self.resource)

    def _dispatch(self, events: builtins.list[tuple[str, Obj | None, Obj | None]]) -> None:
        with self._dispatch_lock:
            for event_type, old, new in events:
                for handler in list(self._handlers):
                    self._call(handler, event_type, old, new)

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0  # consecutive failures without progress (an event or a completed watch)
        while not self._stop.is_set():
            self._progress = False
            try:
                resource_version = self._fill()
                while not self._stop.is_set():
                    resource_version = self._watch(resource_version)
                    self._progress = True
            except GoneError as exc:
                self.stats["gone"] += 1
                failures = 1 if self._progress else failures + 1
                delay = 0.0 if failures == 1 else self._delay(failures - 1)  # the first relist at once
                log.info("%r: %s; relisting%s", self, exc, f" in {delay:.1f}s" if delay else "")
            except Exception as exc:  # noqa: BLE001 - any error: back off, then relist
                if self._stop.is_set():
                    break
                self.stats["errors"] += 1
                self.last_error = exc
                failures = 1 if self._progress else failures + 1
                delay = self._delay(failures)
                log.warning("%r: list/watch failed (%s); relisting in %.1fs", self, _describe(exc), delay)
            else:
                break
            if self._stop.wait(delay):
                break

    def _delay(self, failures: int) -> float:
        """The pause after `failures` consecutive failures (from 1): the backoff, jittered downwards."""
        return self._backoff.delay(failures - 1) * random.uniform(1.0 - SETTINGS.watch.relist_jitter, 1.0)

    def _selector_query(self) -> builtins.list[tuple[str, str]]:
        query = []
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    def _fill(self) -> str:
        """Fill (or refill) the store from the apiserver, streamed when it can; returns the resourceVersion to watch
        on from."""
        if self._stream_lists:
            try:
                return self._stream_and_replace()
            except StreamRefused as exc:
                self._stream_lists = False
                log.info("%r: %s; listing page by page from now on", self, exc)
        with self._listing():
            return self._list_and_replace()

    def _listing(self) -> AbstractContextManager[None]:
        """What a whole list (the first or a relist, up to its store replaced) runs under: no full collection
        of the cycle collector meanwhile, its survivors frozen after it (informers.heap)."""
        return listing()

    def _stream_and_replace(self) -> str:
        """A streamed list: the current objects as the initial events of a watch, the store replaced at the bookmark
        that ends them; then the same stream is followed as the watch. Returns the last resourceVersion seen when
        the stream ends (the caller watches on from it)."""
        try:
            stream = self._open_watch([("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")])
        except ApiException as exc:
            if exc.status in (400, 422):  # WatchList off (the default of 1.30, 1.31 and 1.33)
                raise StreamRefused(f"the apiserver does not stream lists ({exc.status} {exc.reason})") from exc
            raise
        lines = stream.lines()
        try:
            with self._listing():  # the initial events only: the watch that follows them is not a list
                resource_version = self._receive_initial_events(lines)
        except BaseException:
            self._close_stream(stream)
            raise
        return self._follow(stream, lines, resource_version)

    def _receive_initial_events(self, lines: Iterator[bytes]) -> str:
        """Read a streamed list's initial events up to the bookmark that ends them and replace the store with
        them, as `_list_and_replace` does with the pages of a LIST; returns the bookmark's resourceVersion."""
        seen = Listed(bool(self._items))
        batch: list[tuple[str, Obj]] = []
        timing = ListTiming(streamed=True)
        spent = dict.fromkeys(("waiting", "decoding", "storing"), 0.0)
        current = self._items  # only this thread writes the store (see _list_and_replace)
        while True:
            started = time.monotonic()
            line = next(lines, None)
            received = time.monotonic()
            if line is None:  # not the end of the initial events: a server that does not know them
                raise StreamRefused("the stream ended before the bookmark that ends its initial events")
            event = decode_json(line)
            decoded = time.monotonic()
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                raise _watch_error(obj)
            if event_type == "BOOKMARK":
                annotations = obj.get("metadata", {}).get("annotations") or {}
                if annotations.get(INITIAL_EVENTS_END) == "true":
                    resource_version = resource_version_of(obj)
                    if resource_version is None:
                        raise ValueError("the bookmark that ends the initial events has no resourceVersion")
                    break
                continue  # an ordinary bookmark: the resourceVersion moves only once the store holds the objects
            if event_type != DELETED:  # never among initial events; a key not seen is deleted at the end anyway
                key = self._key(obj)
                batch.append((key, self._fresh(current.get(key), obj)))
            for part, seconds in (("waiting", received - started), ("decoding", decoded - received)):
                spent[part] += seconds
            spent["storing"] += time.monotonic() - decoded
            if len(batch) >= self._page_size:
                self._end_batch(batch, False, timing, spent, seen)
                batch = []
                if self._stop.is_set():
                    raise InterruptedError("stopped during list")
        self._end_batch(batch, True, timing, spent, seen)
        self.stats["streamed"] += 1
        self._store_list(seen, resource_version, timing)
        return resource_version

    def _end_batch(
        self,
        batch: builtins.list[tuple[str, Obj]],
        last: bool,
        timing: ListTiming,
        spent: dict[str, float],
        seen: Listed,
    ) -> None:
        """A streamed list's `page_size` objects: shown to the page observers like a page of a LIST, then stored."""
        self.progressed = time.monotonic()
        if self._page_observers:
            self._observe([obj for _, obj in batch], last)
        observed = time.monotonic()
        self._store_page(batch, seen)
        storing = spent["storing"] + time.monotonic() - observed
        timing.page(spent["waiting"], spent["decoding"], storing, observed - self.progressed)
        spent.update(dict.fromkeys(spent, 0.0))

    def _list_and_replace(self) -> str:
        """LIST page by page and replace the store; returns the list's resourceVersion.

        The next page is asked for while this one is decoded and stored (its continue token is read from
        the undecoded page, checked once the page is decoded): at 100,000 objects the apiserver's time
        and ours overlap instead of adding up."""
        path = self.resource.collection_path(self.namespace)
        seen = Listed(bool(self._items))
        timing = ListTiming()
        # Only this thread writes the store, so reading it here needs no lock: the API and the workers
        # reading the store are never held up while a page of a large relist is prepared.
        current = self._items
        asked = self._ask(path, None)
        while True:
            started = time.monotonic()
            data = asked.result()
            received = self.progressed = time.monotonic()
            guessed = continue_token_of(data)
            if guessed is not None:
                asked = self._ask(path, guessed)
            page = decode_json(data)
            decoded = time.monotonic()
            kind = (page.get("kind") or "").removesuffix("List")
            items = page.pop("items", None) or []
            metadata = page.get("metadata") or {}
            del page, data  # the page's objects as decoded go as soon as each is prepared: one copy of them at most
            stored: list[tuple[str, Obj]] = []
            while items:
                obj = items.pop()
                if kind:
                    obj.setdefault("kind", kind)
                key = self._key(obj)
                stored.append((key, self._fresh(current.get(key), obj)))
            stored.reverse()
            prepared = time.monotonic()
            continue_token = metadata.get("continue")
            if self._page_observers:
                self._observe([obj for _, obj in stored], not continue_token)
            observed = time.monotonic()
            self._store_page(stored, seen)
            timing.page(
                received - started,
                decoded - received,
                prepared - decoded + time.monotonic() - observed,
                observed - prepared,
            )
            if not continue_token:
                resource_version = str(metadata["resourceVersion"])
                break
            if self._stop.is_set():
                raise InterruptedError("stopped during list")
            if continue_token != guessed:  # not read from the undecoded page: ask now
                asked = self._ask(path, continue_token)
        self._store_list(seen, resource_version, timing)
        return resource_version

    def _store_list(self, seen: Listed, resource_version: str, timing: ListTiming) -> None:
        """A whole list is in (its pages stored): count it, keep its timing, delete what it did not show."""
        self.stats["lists"] += 1
        timing.objects = seen.count
        self.last_list = timing  # before the store is synced: the start logs it then
        replacing = time.monotonic()
        self._end_list(seen, resource_version)
        timing.spent["storing"] += time.monotonic() - replacing

    def _ask(self, path: str, continue_token: str | None) -> PageRequest:
        return PageRequest(lambda: self._page(path, continue_token), f"list-{self.resource.plural}")

    def _page(self, path: str, continue_token: str | None) -> bytes:
        """One page of the LIST, as received."""
        query = self._selector_query() + [("limit", str(self._page_size))]
        if continue_token:
            query.append(("continue", continue_token))
        try:
            return self.rest.get_bytes(path, query=query, timeout=self._request_timeout, accept=self._accept[0])
        except ApiException as exc:
            if exc.status == 410:  # the continue token expired: start over
                raise GoneError("list continue token expired") from exc
            raise

    def _fresh(self, stored: Obj | None, listed: Obj) -> Obj:
        """A listed object as the new store keeps it: the stored one if unchanged (no second copy in memory)."""
        if stored is not None and resource_version_of(stored) == resource_version_of(listed):
            return stored
        return self._prepare(listed)

    def _prepare(self, obj: Obj) -> Obj:
        obj.setdefault("apiVersion", self.resource.api_version)  # typed list items carry no apiVersion
        return self._transform(obj) if self._transform is not None else obj

    def _store_page(self, page: builtins.list[tuple[str, Obj]], seen: Listed) -> None:
        """Put one page of a list into the store, object by object (the store never holds two copies of the
        fleet, as a store replaced whole at the list's end would while the list is in), and dispatch the changes:
        ADDED for a new key, MODIFIED for another version; an unchanged object is the stored one, no event."""
        events: list[tuple[str, Obj | None, Obj | None]] = []
        with self._dispatch_lock:  # store change and its dispatch are atomic for add_handler
            with self._lock:
                for key, obj in page:
                    seen.add(key)
                    old = self._items.get(key)
                    if old is obj:
                        continue
                    self._items[key] = obj
                    self._reindex(key, old, obj)
                    events.append((ADDED, None, obj) if old is None else (MODIFIED, old, obj))
            self._dispatch(events)

    def _end_list(self, seen: Listed, resource_version: str) -> None:
        """The list is all stored: DELETED for every key it did not show, then the list's resourceVersion."""
        with self._dispatch_lock:
            events: list[tuple[str, Obj | None, Obj | None]] = []
            with self._lock:
                for key in seen.missing(self._items):
                    old = self._items.pop(key)
                    self._reindex(key, old, None)
                    events.append((DELETED, old, None))
                self.resource_version = resource_version
            log.debug("%r: listed %d objects at %s (%d deleted)", self, seen.count, resource_version, len(events))
            self._dispatch(events)
            # Synced only once the handlers have seen the list (client-go's order): a controller started on
            # "synced" must not get the first list's 100,000 ADDED events on top of its own resync of the same keys.
            if not self._synced.is_set():
                self._synced.set()

    def _watch(self, resource_version: str) -> str:
        """Watch from resource_version until the stream ends; returns the last resourceVersion seen."""
        try:
            stream = self._open_watch([("resourceVersion", resource_version)])
        except ApiException as exc:
            if exc.status == 410:
                raise GoneError(f"watch from resourceVersion {resource_version} expired") from exc
            raise
        return self._follow(stream, stream.lines(), resource_version)

    def _open_watch(self, query: builtins.list[tuple[str, str]]) -> WatchStream:
        """Open a WATCH with bookmarks and a server-side timeout, `query` added; `stop()` can abort it."""
        low, high = self._watch_timeout
        server_timeout = random.randint(low, high) if high > low else low
        stream = self.rest.stream(
            self.resource.collection_path(self.namespace),
            query=[
                *self._selector_query(),
                ("watch", "1"),
                *query,
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(server_timeout)),
            ],
            timeout=(self._request_timeout[0], server_timeout + 30),
            accept=self._accept[1],
        )
        with self._stream_lock:
            self._stream = stream
            if self._stop.is_set():
                stream.abort()
        self.stats["watches"] += 1
        return stream

    def _follow(self, stream: WatchStream, lines: Iterator[bytes], resource_version: str) -> str:
        """Apply the watch events of `lines` until the stream ends; returns the last resourceVersion seen."""
        try:
            for line in lines:
                event = decode_json(line)
                resource_version = self._handle_event(event, resource_version)
                if self._stop.is_set():
                    break
        except Exception:
            if self._stop.is_set():
                return resource_version
            raise
        finally:
            self._close_stream(stream)
        return resource_version

    def _close_stream(self, stream: WatchStream) -> None:
        with self._stream_lock:
            self._stream = None
        stream.close()

    def _handle_event(self, event: dict[str, Any], resource_version: str) -> str:
        event_type = event.get("type")
        obj = event.get("object") or {}
        if event_type == "ERROR":
            raise _watch_error(obj)
        new_rv = resource_version_of(obj) or resource_version
        if event_type == "BOOKMARK":
            self.stats["bookmarks"] += 1
            self._progress = True
            self.resource_version = new_rv
            return new_rv
        if event_type not in (ADDED, MODIFIED, DELETED):
            log.warning("%r: ignoring unknown watch event type %r", self, event_type)
            return resource_version
        self.stats["events"] += 1
        self._progress = True
        obj = self._prepare(obj)
        with self._dispatch_lock:  # store change and its dispatch are atomic for add_handler
            self._apply(event_type, obj, new_rv)
        return new_rv

    def _apply(self, event_type: str, obj: Obj, new_rv: str) -> None:
        key = self._key(obj)
        dispatch: tuple[str, Obj | None, Obj | None] | None = None
        with self._lock:
            old = self._items.get(key)
            if event_type == DELETED:
                if old is not None:
                    del self._items[key]
                    self._reindex(key, old, None)
                    dispatch = (DELETED, obj, None)
            elif old is None or resource_version_of(old) != new_rv:
                self._items[key] = obj
                self._reindex(key, old, obj)
                dispatch = (ADDED, None, obj) if old is None else (MODIFIED, old, obj)
            self.resource_version = new_rv
        if dispatch is not None:
            self._dispatch([dispatch])


def _watch_error(status: Obj) -> Exception:
    """The exception of a watch's ERROR event (a Status): GoneError for 410, else an ApiException."""
    code = status.get("code")
    message = f"{status.get('reason')}: {status.get('message')}"
    if code == 410:
        return GoneError(message)
    return ApiException(status=code, reason=message, body=json.dumps(status))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
