"""Placement cost with 20 vs 200 shards.

    python -m bench.placement [--databases 10000] [--rounds 15] [--iterations 2000]
                              [--live-placements 50] [--live-rounds 10] [--profile]

1. In-process, what placing one database costs the Database controller apart from its writes:
   `PlacementIndex.choose` (what reconciler/database/placement.py `Placer.place` calls), plus the index update that the
   placement's own status change causes when the Database informer delivers it (the count of the
   chosen shard goes up by one). The index follows real `informers.Informer`s (filled by a stub list,
   no apiserver) holding the shards and `--databases` Databases spread over them. 20 and 200
   shards side by side, interleaved, `--iterations` placements per round.
2. On the real apiserver (skip with `--live-placements 0`): the whole `Placer.place` step (the same
   choice plus its status write; its Event is queued and sent in the background) for fresh
   Database objects, with a controller whose shard informer sees 20 Shards and one that sees 200
   (label selectors), interleaved.
Target: placing one database with 200 shards <= 1.2x the cost with 20, for each of the two.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from bench.common import (
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    interleaved,
    log,
    machine_line,
    pyinstrument_profile,
    pyinstrument_text,
    ratio_of,
    report_targets,
    table,
)
from domain.constants import API_VERSION, FINALIZER_TENANT, KIND_DATABASE, KIND_SHARD
from domain.resources import BY_SHARD, DATABASES, SHARDS, database_shard
from informers import Informer, Rest
from informers.rest import WatchStream
from reconciler.placement_index import PlacementIndex

TARGET = 1.2
READY_CONDITIONS = [
    {
        "type": "Ready",
        "status": "True",
        "reason": "Ok",
        "message": "admin connection healthy",
        "lastTransitionTime": "2026-11-30T00:00:00Z",
        "observedGeneration": 1,
    }
]


# -- in-process ------------------------------------------------------------------------------------


class _IdleStream(WatchStream):
    """A watch that never delivers an event (until the informer stops)."""

    def __init__(self) -> None:
        super().__init__(None)
        self._stop = threading.Event()

    def lines(self) -> Iterator[bytes]:
        self._stop.wait()
        return iter(())

    def abort(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()


class ListOnlyRest(Rest):
    """A Rest whose LIST returns fixed objects and whose watch stays silent: fills a real Informer."""

    def __init__(self, items: list[dict[str, Any]], kind: str) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.items = items
        self.kind = kind

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return {
            "kind": f"{self.kind}List",
            "items": [copy.deepcopy(i) for i in self.items],
            "metadata": {"resourceVersion": "1"},
        }

    def get_bytes(self, path: str, **kwargs: Any) -> bytes:
        """The LIST as the informer pages it (one page, no continue token), encoded as the apiserver sends it."""
        return orjson.dumps(self.request("GET", path))

    def stream(self, path: str, **kwargs: Any) -> WatchStream:
        return _IdleStream()


def shard_object(name: str, max_databases: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_SHARD,
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "generation": 1,
            "labels": labels or {},
            "uid": f"uid-{name}",
        },
        "spec": {
            "maxDatabases": max_databases,
            "perconaCluster": {"namespace": "dbprovider", "name": name},
            "admin": {
                "serviceName": f"{name}-primary",
                "port": 5432,
                "secretRef": {"namespace": "dbprovider", "name": f"{name}-provisioner"},
            },
            "client": {"host": f"{name}.db.example", "port": 5432},
        },
        "status": {
            "conditions": copy.deepcopy(READY_CONDITIONS),
            "databaseCount": 0,
            "observedGeneration": 1,
            "connectionBudget": 1_000_000,
        },
    }


def database_object(i: int, shard: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_DATABASE,
        "metadata": {
            "name": f"db-{i:05d}.consumer-a",
            "namespace": "dbprovider",
            "resourceVersion": "1",
            "uid": f"uid-{i}",
            "generation": 1,
            "finalizers": [FINALIZER_TENANT],
        },
        "spec": {"consumer": "consumer-a", "externalId": f"db-{i:05d}", "sizeClass": "small", "engine": "postgres"},
        "status": {
            "shard": shard,
            "phase": "Ready",
            "tenantName": f"t_db_{i:05d}_0123456789",
            "conditions": copy.deepcopy(READY_CONDITIONS),
        },
    }


def filled_informers(shard_count: int, databases: int, capacity: int) -> tuple[Informer, Informer]:
    names = [f"shard-{i:03d}" for i in range(shard_count)]
    # stream_lists off: ListOnlyRest answers a LIST; its watch (a streamed list's too) never sends an event.
    shards = Informer(ListOnlyRest([shard_object(n, capacity) for n in names], "Shard"), SHARDS, stream_lists=False)
    dbs = Informer(
        ListOnlyRest([database_object(i, names[i % shard_count]) for i in range(databases)], "Database"),
        DATABASES,
        "dbprovider",
        stream_lists=False,
    )
    dbs.add_index(BY_SHARD, database_shard)
    for informer in (shards, dbs):
        informer.start()
        informer.wait_for_sync(60)
    return shards, dbs


class Placer:
    """Places fresh databases with a `PlacementIndex` on real informers, as the controller does."""

    def __init__(self, shards: Informer, databases: Informer) -> None:
        self.index = PlacementIndex(database_shard).watch(shards, databases)
        self.serial = 0

    def place_once(self) -> str | None:
        """Choose, then apply the event the placement's status write produces (count + 1)."""
        chosen = self.index.choose("postgres")
        assert chosen is not None
        self.serial += 1
        meta = {"name": f"new-{self.serial}.consumer-a", "namespace": "dbprovider"}
        self.index.database_event(
            "MODIFIED", {"metadata": meta, "status": {}}, {"metadata": meta, "status": {"shard": chosen}}
        )
        return chosen


# -- on the real apiserver -------------------------------------------------------------------------


def live_benchmark(placements: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The whole `Placer.place` step (choice, status write, queued Event) with 20 vs 200 Shards."""
    from datetime import UTC, datetime

    from domain.config import load_install_config
    from informers import SECRETS
    from reconciler.database import Database, DatabaseController
    from reconciler.events import EventRecorder

    stack = Stack("placement")
    informers: list[Informer] = []
    events: EventRecorder | None = None
    try:
        dev = stack.start_dev()
        rest = stack.admin_rest(8)
        rest.delete(SHARDS, dev.shard)  # only the benchmark's shards
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for label, count in (("s20", 20), ("s200", 200)):
            for i in range(count):
                body = shard_object(f"{label}-{i:03d}", 10_000, {"bench-placement": label})
                status = body.pop("status")
                for key in ("resourceVersion", "uid"):
                    body["metadata"].pop(key)
                body["metadata"].pop("generation")
                created = rest.create(SHARDS, body)
                status["conditions"][0]["lastTransitionTime"] = now
                rest.patch(SHARDS, created["metadata"]["name"], {"status": status}, subresource="status")
        total = placements * rounds * 2 + 20
        log(f"creating {total} Database objects to place")
        for i in range(total):
            rest.create(
                DATABASES,
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND_DATABASE,
                    "metadata": {"name": f"place-{i:04d}.{dev.consumer}", "namespace": dev.namespace},
                    "spec": {
                        "consumer": dev.consumer,
                        "externalId": f"place-{i:04d}",
                        "sizeClass": "small",
                        "engine": "postgres",
                    },
                },
                dev.namespace,
            )
        config = load_install_config(
            {
                "releaseName": "dbprovider",
                "namespace": dev.namespace,
                "tls": {"secretName": "dbprovider-tls"},
                "sizeClasses": {"small": {"connectionLimit": 5}},
            }
        )
        databases = Informer(rest, DATABASES, dev.namespace)
        databases.add_index(BY_SHARD, database_shard)
        secrets = Informer(rest, SECRETS, dev.namespace)
        controllers = {}
        shard_informers = {}
        events = EventRecorder(rest, "bench")
        informers += [databases.start(), secrets.start()]
        for label in ("s20", "s200"):
            shards = Informer(rest, SHARDS, label_selector=f"bench-placement={label}")
            informers.append(shards.start())
            shards.wait_for_sync(60)
            shard_informers[label] = shards
            controllers[label] = DatabaseController(rest, config, dev.namespace, databases, shards, secrets, events)
        databases.wait_for_sync(60)
        secrets.wait_for_sync(60)
        pending = iter(range(total))

        def placer(label: str) -> Callable[[], None]:
            controller = controllers[label]

            def once() -> None:
                name = f"place-{next(pending):04d}.{dev.consumer}"
                db = databases.get(f"{dev.namespace}/{name}")
                assert db is not None
                database = Database.read(db)
                assert controller.placer.place(database) is None and (database.status.shard or "").startswith(label)

            return once

        variants = {"20 shards": placer("s20"), "200 shards": placer("s200")}
        interleaved(variants, 1, 10)  # warm-up: connections, first events
        steps = interleaved(variants, rounds, placements)
        # The choice alone on the same live informers, to tell it from the writes' noise.
        compute = interleaved(
            {
                "20 shards": lambda: controllers["s20"].placement.choose("postgres"),
                "200 shards": lambda: controllers["s200"].placement.choose("postgres"),
            },
            rounds,
            500,
        )
        return steps, compute
    finally:
        if events is not None:
            events.close()
        for informer in informers:
            informer.stop()
        stack.close()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, profile="pyinstrument on the 200-shard placement")
    parser.add_argument("--databases", type=int, default=10_000, help="Databases in the informer (default 10,000)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=2000, help="in-process placements per round")
    parser.add_argument(
        "--live-placements",
        type=int,
        default=50,
        help="placements per round on the real apiserver (0: skip; default 50)",
    )
    parser.add_argument("--live-rounds", type=int, default=10)
    args = parser.parse_args(argv)

    print(f"placement: 20 vs 200 shards, {args.databases} Databases in the cache")
    print(f"machine: {machine_line()}")
    capacity = 1_000_000  # never full, however many rounds place
    small = filled_informers(20, args.databases, capacity)
    large = filled_informers(200, args.databases, capacity)
    try:
        placers = {"20 shards": Placer(*small), "200 shards": Placer(*large)}
        variants = {name: placer.place_once for name, placer in placers.items()}
        interleaved(variants, 1, args.iterations // 10)  # warm-up
        samples = interleaved(variants, args.rounds, args.iterations)
        profile_text = None
        if args.profile:
            profiler = pyinstrument_profile()
            for _ in range(args.iterations):
                placers["200 shards"].place_once()
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            profile_text = pyinstrument_text(profiler, args.profile_dir / "placement-200.pyinstrument.txt")
    finally:
        for informer in (*small, *large):
            informer.stop()
    best, median = ratio_of(samples, "200 shards", "20 shards")
    rows = [(name, f"{1e6 * min(v):.1f} us", f"{1e6 * statistics.median(v):.1f} us") for name, v in samples.items()]
    table(
        f"placement in-process: choice + index update ({args.iterations} per round, {args.rounds} rounds)",
        rows + [("ratio", f"{best:.2f}x", f"{median:.2f}x")],
        ("shards", "best round", "median round"),
    )
    if profile_text:
        print("\n== pyinstrument, 200-shard placement (choice + index update)\n" + profile_text[:4000])
    targets = [
        Target(
            f"placement in-process 200 vs 20 shards {best:.2f}x (median {median:.2f}x)",
            f"<= {TARGET}x",
            best <= TARGET,
            key="in-process",
            what="placing one database in-process, 200 over 20 shards (best rounds)",
            value=best,
            unit="x",
        )
    ]
    if args.live_placements > 0:
        started = time.monotonic()
        live, compute = live_benchmark(args.live_placements, args.live_rounds)
        live_best, live_median = ratio_of(live, "200 shards", "20 shards")
        rows = [(name, f"{1e3 * min(v):.2f} ms", f"{1e3 * statistics.median(v):.2f} ms") for name, v in live.items()]
        rows += [
            (f"{name}: the choice alone", f"{1e6 * min(v):.1f} us", f"{1e6 * statistics.median(v):.1f} us")
            for name, v in compute.items()
        ]
        table(
            f"whole _place step on the real apiserver (choice + status write; {args.live_placements} per round, "
            f"{args.live_rounds} rounds; {time.monotonic() - started:.0f} s with setup)",
            rows + [("ratio", f"{live_best:.2f}x", f"{live_median:.2f}x")],
            ("shards", "best round", "median round"),
        )
        targets.append(
            Target(
                f"_place step on the apiserver 200 vs 20 shards {live_median:.2f}x (best rounds {live_best:.2f}x)",
                f"<= {TARGET}x",
                live_median <= TARGET,
                key="place-step",
                what="the whole placement step on the apiserver, 200 over 20 shards (median rounds)",
                value=live_median,
                unit="x",
            )
        )
    report_targets(targets, ResultsFiles.of("bench.placement", args, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
