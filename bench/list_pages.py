"""The informers' first LIST at fleet size, by page size: what a manager's start waits for.

    python -m bench.list_pages [--count 100000] [--sizes 500,5000] [--rounds 3] [--threads 24] [--lock PATH]

Creates `--count` Databases with their credentials Secrets on a real kube-apiserver + etcd (the shapes
bench.scale creates; no manager runs), then fills the manager's two large caches as a start does, both
at once, with the product's own `Informer` (the Databases; the credentials Secrets by their label
selector), once per page size in turn, `--rounds` times. Per size it prints the time until both caches
were synced and the CPU the kube-apiserver, etcd and this process spent on it (psutil), the median over
the rounds and its ratio against the first size (the baseline, measured side by side). The target line:
the default page size (SETTINGS.watch.list_page_size) costs the apiserver at most as much as 500 a page.
`--lock` takes the machine's benchmark lock for the listing only (as bench.scale), not for the creating.
"""

from __future__ import annotations

import statistics
import time

import psutil

from bench.common import Stack, Target, bench_parser, log, machine_lock, report_targets, table
from bench.scale import create_databases
from domain.constants import CREDENTIALS_SECRET_SELECTOR
from domain.settings import SETTINGS
from informers import SECRETS, Informer, Rest
from reconciler.resources import DATABASES


def fill(rest: Rest, namespace: str, page_size: int) -> float:
    """Seconds until a Database and a credentials Secret informer, started together, are both synced."""
    started = time.monotonic()
    informers = [
        Informer(rest, DATABASES, namespace, page_size=page_size),
        Informer(rest, SECRETS, namespace, label_selector=CREDENTIALS_SECRET_SELECTOR, page_size=page_size),
    ]
    try:
        for informer in informers:
            informer.start()
        for informer in informers:
            if not informer.wait_for_sync(timeout=600):
                raise RuntimeError(f"{informer.resource.plural} not synced: {informer.sync_problem()}")
        return time.monotonic() - started
    finally:
        for informer in informers:
            informer.stop()


def measure(
    rest: Rest,
    namespace: str,
    sizes: list[int],
    rounds: int,
    processes: dict[str, psutil.Process],
    measured: dict[int, list[dict[str, float]]],
) -> None:
    """Fill both caches once per page size in turn, `rounds` times, recording the time and CPU of each."""
    for round_ in range(1, rounds + 1):
        for size in sizes:
            before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
            synced = fill(rest, namespace, size)
            row = {name: sum(p.cpu_times()[:2]) - before[name] for name, p in processes.items()}
            row["synced"] = synced
            measured[size].append(row)
            log(f"round {round_}, {size} a page: synced in {synced:.2f} s, apiserver {row['kube-apiserver']:.2f} CPU-s")


def main() -> None:
    parser = bench_parser(__doc__, lock="the listing only, not the creating")
    parser.add_argument("--count", type=int, default=100_000, help="Databases (and Secrets) to create")
    parser.add_argument(
        "--sizes", default=f"500,{SETTINGS.watch.list_page_size}", help="page sizes, the first is the baseline"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=24, help="threads creating the objects")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    stack = Stack("list-pages")
    try:
        dev = stack.start_dev()
        rest = stack.admin_rest()
        log(f"creating {args.count} Databases and their Secrets")
        took = create_databases(
            rest, stack, ["list-shard"], [f"list-c{i}" for i in range(100)], args.count, args.threads
        )
        log(f"created in {took:.0f} s")
        processes = {
            "kube-apiserver": psutil.Process(stack.kube.apiserver_pid),
            "etcd": psutil.Process(stack.kube.etcd_pid),
            "this process": psutil.Process(),
        }
        log(f"listing: page sizes {sizes}, {args.rounds} rounds")
        measured: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
        with machine_lock(args.lock):
            measure(rest, dev.namespace, sizes, args.rounds, processes, measured)
    finally:
        stack.close()

    columns = ["synced", "kube-apiserver", "etcd", "this process"]
    medians = {size: {c: statistics.median(r[c] for r in rows) for c in columns} for size, rows in measured.items()}
    base = medians[sizes[0]]
    rows = [
        [
            f"{size} a page",
            *(
                f"{medians[size][c]:.2f} ({medians[size][c] / base[c]:.2f}x)" if base[c] else f"{medians[size][c]:.2f}"
                for c in columns
            ),
        ]
        for size in sizes
    ]
    title = (
        f"{args.count} Databases + {args.count} Secrets, both caches filled at once; medians of {args.rounds} rounds"
    )
    table(title, rows, ["page size", "synced (s)", "apiserver CPU-s", "etcd CPU-s", "informers CPU-s"])
    default = SETTINGS.watch.list_page_size
    if default in medians and sizes[0] == 500:
        ratio = medians[default]["kube-apiserver"] / base["kube-apiserver"]
        report_targets([Target(f"apiserver CPU, {default} vs 500 a page: {ratio:.2f}x", "<= 1.00x", ratio <= 1.0)])


if __name__ == "__main__":
    main()
