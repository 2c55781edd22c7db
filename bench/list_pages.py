"""The informers' first list at fleet size, paged or streamed: what a manager's start waits for.

    python -m bench.list_pages [--count 100000] [--ways 5000,streamed] [--rounds 3] [--threads 24]
                               [--compacted] [--relists N] [--lock PATH]

Creates `--count` Databases with their credentials Secrets on a real kube-apiserver + etcd (the shapes
bench.scale creates; no manager runs), then fills the manager's two large caches as a start does, both
at once, with the product's own `Informer` (the Databases; the credentials Secrets by their label
selector), once per way in turn, `--rounds` times. A way is a page size (a paginated LIST) or `streamed`
(a WATCH with sendInitialEvents, the default: SETTINGS.watch.stream_lists). Per way it prints the time
until both caches were synced, the CPU the kube-apiserver, etcd and this process spent on it (psutil) and
the objects the apiserver read from etcd for it (its apiserver_storage_list_fetched_objects_total), the
median over the rounds and its ratio against the first way (the baseline, measured side by side).

`--compacted` measures the state of a cluster that has run for a while since its objects last changed:
the apiserver compacts etcd every 2 minutes instead of every 5, and the listing starts once its watch
cache has dropped its snapshots (a paginated LIST's later pages are then read from etcd). The target
lines: the streamed list costs the apiserver at most what the default page size does, and (`--compacted`)
reads nothing from etcd.
`--lock` takes the machine's benchmark lock exclusive for the listing and shared for the creating (as
bench.scale): another setup may run beside the creating, a measurement (a `flock` from the shell) may not.

`--relists N` measures a relist instead of a start: both caches are filled as a manager's start does (under
`caches_filling`, frozen after it), then both informers relist at once, N times in a row, as after a 410 Gone
(the product's relist path after the 410; the 410 itself is raised at the end of the watch, which the
benchmark breaks: tests/runtime/test_informer.py forces real ones with a compacting apiserver). Per relist:
the cycle collector's full collections and the time they held the GIL (gc.callbacks), the CPU the process
spent, the longest a probe thread that asks to run every millisecond had to wait (what the API's threads see),
and the RSS and frozen objects after each relist. Side by side, interleaved each round: `main` (a relist
as before: no deferral, nothing frozen), `freeze` (deferred, then frozen without a collection: the trap the
fix avoids) and `collect+freeze` (the fix: `informers.heap.listing`).
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import psutil

from bench.common import (
    COMPACTING,
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    log,
    machine_lock,
    read_from_etcd,
    report_targets,
    table,
    wait_until_compacted,
)
from bench.scale import create_databases
from domain.constants import CREDENTIALS_SECRET_SELECTOR
from domain.resources import DATABASES
from domain.settings import SETTINGS, Backoff
from informers import SECRETS, Informer, Rest
from informers.heap import caches_filling, caches_released, listing
from informers.informer import GoneError
from informers.rest import WatchStream

STREAMED = "streamed"


def list_options(way: str) -> dict[str, Any]:
    """An informer's options for a way of listing: `streamed`, or a page size."""
    return {"stream_lists": True} if way == STREAMED else {"stream_lists": False, "page_size": int(way)}


def fill(rest: Rest, namespace: str, way: str) -> float:
    """Seconds until a Database and a credentials Secret informer, started together, are both synced."""
    options = list_options(way)
    started = time.monotonic()
    informers = [
        Informer(rest, DATABASES, namespace, **options),
        Informer(rest, SECRETS, namespace, label_selector=CREDENTIALS_SECRET_SELECTOR, **options),
    ]
    try:
        for informer in informers:
            informer.start()
        for informer in informers:
            if not informer.wait_for_sync(timeout=600):
                raise RuntimeError(f"{informer.resource.plural} not synced: {informer.sync_problem()}")
        if way == STREAMED and not all(informer.stats["streamed"] for informer in informers):
            raise RuntimeError("the apiserver did not stream the lists")
        return time.monotonic() - started
    finally:
        for informer in informers:
            informer.stop()


def measure(
    stack: Stack, namespace: str, ways: list[str], rounds: int, processes: dict[str, psutil.Process]
) -> dict[str, list[dict[str, float]]]:
    """Fill both caches once per way in turn, `rounds` times, recording the time and CPU of each."""
    rest = stack.admin_rest()
    measured: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for round_ in range(1, rounds + 1):
        for way in ways:
            before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
            from_etcd = read_from_etcd(stack)
            synced = fill(rest, namespace, way)
            row = {name: sum(p.cpu_times()[:2]) - before[name] for name, p in processes.items()}
            row["synced"] = synced
            row["from etcd"] = read_from_etcd(stack) - from_etcd
            measured[way].append(row)
            log(
                f"round {round_}, {label(way)}: synced in {synced:.2f} s, apiserver {row['kube-apiserver']:.2f} CPU-s, "
                f"{row['from etcd']:.0f} objects read from etcd"
            )
    return measured


# -- relists -----------------------------------------------------------------------------------------


RELIST_WAYS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "main": nullcontext,  # a relist before the fix: collections as CPython schedules them, nothing frozen after
    # The alternative the fix rejects: frozen with no full collection first (whatever cyclic garbage piled up
    # while the collections waited is frozen for good).
    "freeze": lambda: listing(gc.freeze),
    "collect+freeze": listing,  # the fix
}


class RelistedInformer(Informer):
    """The product's informer, its lists run under one of RELIST_WAYS, made to relist on demand as after a
    410 Gone (`force_gone`: its watch is broken and ends with GoneError, which the informer relists on at once).
    `changed`: every listed object is stored anew, as if all had changed while the watch was down."""

    def __init__(self, *args: Any, way: str, changed: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, backoff=Backoff(0.05, cap=0.05), **kwargs)
        self._way = RELIST_WAYS[way]
        self._changed = changed
        self.gone = threading.Event()
        self.listed = threading.Event()  # set when a list (and what its way does after it) is done

    def _listing(self) -> AbstractContextManager[None]:
        return self._timed_listing()

    @contextmanager
    def _timed_listing(self) -> Iterator[None]:
        with self._way():
            yield
        self.listed.set()

    def _fresh(self, stored: Any, listed: Any) -> Any:
        return self._prepare(listed) if self._changed else super()._fresh(stored, listed)

    def force_gone(self) -> None:
        self.listed.clear()
        self.gone.set()
        with self._stream_lock:
            if self._stream is not None:
                self._stream.abort()

    def _follow(self, stream: WatchStream, lines: Iterator[bytes], resource_version: str) -> str:
        if not self.gone.is_set():
            try:
                resource_version = super()._follow(stream, lines, resource_version)
            except Exception:
                if not self.gone.is_set():
                    raise
        else:
            self._close_stream(stream)
        if self.gone.is_set():
            self.gone.clear()
            raise GoneError("410 forced by bench.list_pages")
        return resource_version


@dataclass(frozen=True)
class RelistSetup:
    relists: int  # in a row, per round and way
    changed: bool  # every object stored anew (see RelistedInformer)
    listed_by: str  # `streamed` or a page size


class GcRecorder:
    """Every collection of the cycle collector while installed: generation, seconds (the GIL held), objects
    found unreachable."""

    def __init__(self) -> None:
        self.collections: list[tuple[int, float, int]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.collections.append((info["generation"], now - self._started, info["collected"]))


class Probe:
    """A thread that asks to run every millisecond; `take()` is the longest it waited beyond that since the last
    take (what any other thread of the process, the API's, would have waited)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - 0.001)
            last = now

    def take(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def relist_round(
    rest: Rest, namespace: str, way: str, setup: RelistSetup, recorder: GcRecorder, probe: Probe
) -> list[dict[str, float]]:
    """Fill both caches as a start does, then relist both at once `setup.relists` times; one row per relist."""
    options = {"way": way, "changed": setup.changed, **list_options(setup.listed_by)}
    informers = [
        RelistedInformer(rest, DATABASES, namespace, **options),
        RelistedInformer(rest, SECRETS, namespace, label_selector=CREDENTIALS_SECRET_SELECTOR, **options),
    ]
    process = psutil.Process()
    rows: list[dict[str, float]] = []
    try:
        with caches_filling():  # as the manager's start: frozen once both are synced
            for informer in informers:
                informer.start()
            for informer in informers:
                if not informer.wait_for_sync(timeout=600):
                    raise RuntimeError(f"{informer.resource.plural} not synced: {informer.sync_problem()}")
        for informer in informers:
            informer.listed.wait(60)
        for _ in range(setup.relists):
            recorder.collections.clear()
            probe.take()
            cpu, started = time.process_time(), time.perf_counter()
            for informer in informers:
                informer.force_gone()
            for informer in informers:
                if not informer.listed.wait(600):
                    raise RuntimeError(f"{informer.resource.plural} did not relist: {informer.sync_problem()}")
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            stall = probe.take()
            full = [(took, found) for generation, took, found in recorder.collections if generation == 2]
            rows.append(
                {
                    "seconds": seconds,
                    "cpu": cpu,
                    "full": len(full),
                    "full s": sum(took for took, _ in full),
                    "longest full": max((took for took, _ in full), default=0.0),
                    "young s": sum(took for generation, took, _ in recorder.collections if generation < 2),
                    "found": sum(found for _, found in full),
                    "stall": stall,
                    "rss": process.memory_info().rss / 2**20,
                    "frozen": gc.get_freeze_count(),
                }
            )
        if any(informer.stats["gone"] != setup.relists for informer in informers):
            raise RuntimeError(f"not every relist came from a 410: {[i.stats for i in informers]}")
        return rows
    finally:
        for informer in informers:
            informer.stop()
        caches_released()  # as a stopped manager
        gc.collect()


def measure_relists(
    rest: Rest, namespace: str, ways: list[str], rounds: int, setup: RelistSetup
) -> dict[str, list[list[dict[str, float]]]]:
    """Each way in turn, `rounds` times: per way, per round, the rows of its relists."""
    measured: dict[str, list[list[dict[str, float]]]] = {way: [] for way in ways}
    recorder, probe = GcRecorder(), Probe()
    gc.callbacks.append(recorder)
    try:
        for round_ in range(1, rounds + 1):
            for way in ways:
                rows = relist_round(rest, namespace, way, setup, recorder, probe)
                measured[way].append(rows)
                log(
                    f"round {round_}, {way}: "
                    + "; ".join(
                        f"{r['seconds']:.2f} s, {r['full']:.0f} full ({r['full s']:.2f} s), stall "
                        f"{r['stall'] * 1000:.0f} ms, RSS {r['rss']:.0f} MB, frozen {r['frozen']:.0f}"
                        for r in rows
                    )
                )
    finally:
        gc.callbacks.remove(recorder)
        probe.stop()
    return measured


def report_relists(
    measured: dict[str, list[list[dict[str, float]]]], count: int, setup: RelistSetup, results: ResultsFiles
) -> None:
    """Medians over every relist of every round per way, ratios against the first way; RSS and frozen objects
    after the first and the last relist (median over the rounds)."""
    ways = list(measured)
    columns = ["seconds", "cpu", "full", "full s", "longest full", "stall"]
    medians = {
        way: {c: statistics.median(row[c] for rows in rounds for row in rows) for c in columns}
        for way, rounds in measured.items()
    }
    base = medians[ways[0]]

    def cell(way: str, column: str, scale: float = 1.0, digits: int = 2) -> str:
        value = medians[way][column]
        ratio = f" ({value / base[column]:.2f}x)" if base[column] else ""
        return f"{value * scale:.{digits}f}{ratio}"

    rows = [
        [
            way,
            cell(way, "seconds"),
            cell(way, "cpu"),
            cell(way, "full", digits=0),
            cell(way, "full s", digits=3),
            cell(way, "longest full", 1000, 0),
            cell(way, "stall", 1000, 0),
        ]
        for way in ways
    ]
    what = "every object changed" if setup.changed else "the objects unchanged (a 410's usual case)"
    what += f", {label(setup.listed_by)}"
    table(
        f"a relist of {count} Databases + {count} Secrets, both informers at once ({what}); medians of "
        f"{sum(len(r) for r in measured[ways[0]])} relists per way",
        rows,
        ["way", "relist (s)", "CPU-s", "full collections", "their pause (s)", "longest (ms)", "longest stall (ms)"],
    )
    memory = []
    for way in ways:
        first = statistics.median(rounds[0]["rss"] for rounds in measured[way])
        last = statistics.median(rounds[-1]["rss"] for rounds in measured[way])
        frozen_first = statistics.median(rounds[0]["frozen"] for rounds in measured[way])
        frozen_last = statistics.median(rounds[-1]["frozen"] for rounds in measured[way])
        found = statistics.median(row["found"] for rounds in measured[way] for row in rounds)
        memory.append([way, f"{first:.0f} -> {last:.0f}", f"{frozen_first:.0f} -> {frozen_last:.0f}", f"{found:.0f}"])
    table(
        f"memory over {setup.relists} relists in a row (medians over the rounds)",
        memory,
        ["way", "RSS after the first -> last relist (MB)", "frozen objects", "unreachable found per relist"],
    )
    fixed = "collect+freeze"
    if fixed in medians and "main" in medians:
        stall = medians[fixed]["stall"] / medians["main"]["stall"] if medians["main"]["stall"] else 0.0
        frozen = [statistics.median(rounds[-1]["frozen"] - rounds[0]["frozen"] for rounds in measured[fixed])]
        targets = []
        if medians["main"]["full"]:  # else there is nothing for the fix to spare
            targets.append(
                Target(
                    f"longest stall of another thread in a relist, fixed vs main: {stall:.2f}x",
                    "<= 0.50x",
                    stall <= 0.5,
                    key="relist-stall",
                    what="the longest stall another thread sees in a relist, over the plain relist's",
                    value=stall,
                    unit="x",
                )
            )
        report_targets(
            [
                *targets,
                Target(
                    f"frozen objects added from the first to the last relist (fixed): {frozen[0]:.0f}",
                    "<= 1000",
                    frozen[0] <= 1000,
                    key="relist-frozen",
                    what="frozen objects added from the first relist to the last",
                    value=frozen[0],
                    unit="objects",
                ),
            ],
            results,
        )


def label(way: str) -> str:
    return "streamed list" if way == STREAMED else f"{way} a page"


def main() -> None:
    parser = bench_parser(__doc__, lock="the listing (exclusive) and the creating (shared with other setups)")
    parser.add_argument("--count", type=int, default=100_000, help="Databases (and Secrets) to create")
    parser.add_argument(
        "--ways",
        default=f"{SETTINGS.watch.list_page_size},{STREAMED}",
        help="page sizes and/or `streamed`, comma-separated; the first is the baseline",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=24, help="threads creating the objects")
    parser.add_argument(
        "--compacted", action="store_true", help="list once etcd is compacted past the objects (see above)"
    )
    parser.add_argument("--relists", type=int, default=0, help="measure N relists in a row instead (see above)")
    parser.add_argument(
        "--relist-ways", default=",".join(RELIST_WAYS), help="with --relists: the ways, the first is the baseline"
    )
    parser.add_argument(
        "--changed", action="store_true", help="with --relists: every object stored anew, as if all had changed"
    )
    parser.add_argument(
        "--relist-by", default=STREAMED, help="with --relists: how the informers list, `streamed` or a page size"
    )
    args = parser.parse_args()
    ways = args.ways.split(",")

    stack = Stack("list-pages", kube_args=COMPACTING if args.compacted else None)
    relisted: dict[str, list[list[dict[str, float]]]] = {}
    setup = RelistSetup(args.relists, args.changed, args.relist_by)
    try:
        with machine_lock(args.lock, shared=True):
            dev = stack.start_dev()
            rest = stack.admin_rest()
            log(f"creating {args.count} Databases and their Secrets")
            took = create_databases(
                rest, stack, ["list-shard"], [f"list-c{i}" for i in range(100)], args.count, args.threads
            )
            log(f"created in {took:.0f} s")
        if args.compacted:
            wait_until_compacted(stack, DATABASES.collection_path(dev.namespace))
            log("etcd compacted past the objects: the LIST's later pages come from etcd")
        if args.relists:
            log(f"relisting: {args.relist_ways}, {args.relists} relists in a row, {args.rounds} rounds")
            with machine_lock(args.lock):
                relisted = measure_relists(rest, dev.namespace, args.relist_ways.split(","), args.rounds, setup)
            return
        processes = {
            "kube-apiserver": psutil.Process(stack.kube.apiserver_pid),
            "etcd": psutil.Process(stack.kube.etcd_pid),
            "this process": psutil.Process(),
        }
        log(f"listing: {[label(way) for way in ways]}, {args.rounds} rounds")
        with machine_lock(args.lock):
            measured = measure(stack, dev.namespace, ways, args.rounds, processes)
    finally:
        stack.close()
        if relisted:
            report_relists(relisted, args.count, setup, ResultsFiles.of("bench.list_pages", args))

    columns = ["synced", "kube-apiserver", "etcd", "this process", "from etcd"]
    medians = {way: {c: statistics.median(r[c] for r in rows) for c in columns} for way, rows in measured.items()}
    base = medians[ways[0]]
    rows = [
        [
            label(way),
            *(
                f"{medians[way][c]:.2f} ({medians[way][c] / base[c]:.2f}x)" if base[c] else f"{medians[way][c]:.0f}"
                for c in columns
            ),
        ]
        for way in ways
    ]
    state = "etcd compacted past them" if args.compacted else "right after they were written"
    title = (
        f"{args.count} Databases + {args.count} Secrets ({state}), both caches filled at once; "
        f"medians of {args.rounds} rounds"
    )
    table(title, rows, ["way", "synced (s)", "apiserver CPU-s", "etcd CPU-s", "informers CPU-s", "read from etcd"])
    default = str(SETTINGS.watch.list_page_size)
    if STREAMED in medians and default in medians:
        streamed, paged = medians[STREAMED], medians[default]
        ratio = streamed["kube-apiserver"] / paged["kube-apiserver"]
        targets = [
            Target(
                f"apiserver CPU, streamed vs {default} a page: {ratio:.2f}x",
                "<= 1.00x",
                ratio <= 1.0,
                key="streamed-apiserver-cpu",
                what="the apiserver's CPU for a start's two large lists streamed, over paged at the default size",
                value=ratio,
                unit="x",
            )
        ]
        if args.compacted:
            targets.append(
                Target(
                    f"objects the streamed list read from etcd: {streamed['from etcd']:.0f}",
                    "<= 2",
                    streamed["from etcd"] <= 2,
                    key="streamed-etcd-reads",
                    what="objects a streamed list reads from etcd once etcd is compacted past them",
                    value=streamed["from etcd"],
                    unit="objects",
                )
            )
        report_targets(targets, ResultsFiles.of("bench.list_pages", args))


if __name__ == "__main__":
    main()
