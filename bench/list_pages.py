"""The informers' first list at fleet size, paged or streamed: what a manager's start waits for.

    python -m bench.list_pages [--count 100000] [--ways 5000,streamed] [--rounds 3] [--threads 24]
                               [--compacted] [--lock PATH]

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
`--lock` takes the machine's benchmark lock for the listing only (as bench.scale), not for the creating.
"""

from __future__ import annotations

import statistics
import time

import psutil

from bench.common import (
    COMPACTING,
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
from domain.settings import SETTINGS
from informers import SECRETS, Informer, Rest
from reconciler.resources import DATABASES

STREAMED = "streamed"


def fill(rest: Rest, namespace: str, way: str) -> float:
    """Seconds until a Database and a credentials Secret informer, started together, are both synced."""
    options = {"stream_lists": True} if way == STREAMED else {"stream_lists": False, "page_size": int(way)}
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


def label(way: str) -> str:
    return "streamed list" if way == STREAMED else f"{way} a page"


def main() -> None:
    parser = bench_parser(__doc__, lock="the listing only, not the creating")
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
    args = parser.parse_args()
    ways = args.ways.split(",")

    stack = Stack("list-pages", kube_args=COMPACTING if args.compacted else None)
    try:
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
        targets = [Target(f"apiserver CPU, streamed vs {default} a page: {ratio:.2f}x", "<= 1.00x", ratio <= 1.0)]
        if args.compacted:
            targets.append(
                Target(
                    f"objects the streamed list read from etcd: {streamed['from etcd']:.0f}",
                    "<= 2",
                    streamed["from etcd"] <= 2,
                )
            )
        report_targets(targets)


if __name__ == "__main__":
    main()
