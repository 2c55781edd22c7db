"""Quota across replicas: 200 concurrent PUTs of one consumer split over 3 `dbprovider manager` processes.

    python -m bench.quota [--puts 200] [--max-databases 150] [--replicas 3] [--bursts 3]

One stack (kube-apiserver + etcd, PostgreSQL 18, the product installed), `--replicas` manager
processes, and rounds that alternate so that every burst has a baseline right before and after it
(g0, p0, g1, p1, ..., g<bursts>):
- bursts p<n>: a fresh consumer with maxDatabases `--max-databases`; `--puts` threads send
  `PUT /v1/databases/<id>` (distinct ids) at once, each on a new TLS connection, spread evenly over
  the replicas. Every replica serves the API and reserves slots in the consumer's quota ledger; the
  leader also reconciles (the shard does not accept databases here, so no SQL runs: the API's path
  is measured, not provisioning).
- baselines g<n>: the same number of threads send an authenticated `GET` of one existing database
  (of another consumer) at once, on new TLS connections, over the same replicas.
Reported: the answers per burst, the databases that exist afterwards, latency p50/p99/max per round,
and the ledger's apiserver requests (ConfigMap GET/POST/PATCH and conflicts) per burst.
Targets: every burst creates exactly `--max-databases` and answers the rest 429; the median over the
bursts of p99(create answers) / mean p99 of its two neighbouring GET rounds <= 3x.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TypedDict

import requests

from bench.common import (
    ManagerProcess,
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    counter_delta,
    fmt_s,
    log,
    machine_line,
    percentile,
    report_targets,
    table,
    wait_for,
)
from domain.resources import DATABASES, SHARDS
from informers import Rest

TARGET_RATIO = 3.0
Call = Callable[[requests.Session], requests.Response]


class Burst(TypedDict):
    """What one burst of PUTs got: the answers, the Databases created, the ledger's requests, the
    apiserver's mean time per write (ms, by "Database POST" and "ledger PATCH")."""

    statuses: Counter[int]
    created: int
    ledger: Counter[str]
    latency: dict[str, float]


def concurrent(calls: list[Call]) -> tuple[Counter[int], list[float]]:
    """Run `calls` at once (one thread and one new TLS connection each); (answers, latencies)."""
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(calls))

    def run(call: Call) -> None:
        with requests.Session() as session:
            barrier.wait()
            started = time.perf_counter()
            try:
                code = call(session).status_code
            except requests.RequestException:
                code = 0
            elapsed = time.perf_counter() - started
        with lock:
            statuses[code] += 1
            latencies.append(elapsed)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return statuses, latencies


def request(manager: ManagerProcess, method: str, path: str, token: str) -> Call:
    def call(session: requests.Session) -> requests.Response:
        return session.request(
            method,
            manager.url(path),
            headers={"Authorization": f"Bearer {token}"},
            verify=str(manager.dev.ca_file),
            timeout=120,
        )

    return call


def ledger_requests(stack: Stack) -> Counter[str]:
    """ConfigMap requests (the quota ledger) by verb and code, from apiserver_request_total."""
    found: Counter[str] = Counter()
    for line in stack.apiserver_metrics().splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="configmaps"' in line:
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            code = line.split('code="', 1)[1].split('"', 1)[0]
            found[f"{verb} {code}"] += int(float(line.rsplit(" ", 1)[1]))
    return found


def write_latency(stack: Stack) -> dict[str, float]:
    """Sum and count of the apiserver's own request durations for the burst's writes (Database POST,
    ledger PATCH), from apiserver_request_duration_seconds: "<what> sum" and "<what> count"."""
    found: dict[str, float] = defaultdict(float)
    wanted = {("POST", "databases"): "Database POST", ("PATCH", "configmaps"): "ledger PATCH"}
    for line in stack.apiserver_metrics().splitlines():
        for suffix in ("_sum", "_count"):
            if not line.startswith(f"apiserver_request_duration_seconds{suffix}{{"):
                continue
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            resource = line.split('resource="', 1)[1].split('"', 1)[0] if 'resource="' in line else ""
            what = wanted.get((verb, resource))
            if what is not None:
                found[f"{what} {suffix[1:]}"] += float(line.rsplit(" ", 1)[1])
    return found


def count_databases(rest: Rest, namespace: str, consumer: str) -> int:
    items = rest.list(DATABASES, namespace)["items"]
    return sum(1 for db in items if db["spec"]["consumer"] == consumer)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--puts", type=int, default=200, help="concurrent PUTs per burst (default 200)")
    parser.add_argument("--max-databases", type=int, default=150, help="the consumer's quota (default 150)")
    parser.add_argument("--replicas", type=int, default=3, help="manager processes (default 3)")
    parser.add_argument("--bursts", type=int, default=3, help="bursts, each between two GET rounds (default 3)")
    parser.add_argument(
        "--max-requests-per-consumer",
        type=int,
        default=None,
        metavar="N",
        help="the install's api.maxRequestsPerConsumer (default: the install default, 8)",
    )
    args = parser.parse_args(argv)
    per_consumer = args.max_requests_per_consumer

    print(
        f"quota: {args.puts} concurrent PUTs of one consumer over {args.replicas} replicas, "
        f"maxDatabases {args.max_databases}, api.maxRequestsPerConsumer {per_consumer or 'default'}"
    )
    print(f"machine: {machine_line()}")
    stack = Stack("quota", config={"api": {"maxRequestsPerConsumer": per_consumer}} if per_consumer else None)
    managers: list[ManagerProcess] = []
    try:
        dev = stack.start_dev()
        rest = stack.admin_rest()
        rest.patch(SHARDS, dev.shard, {"spec": {"accepting": False}})  # the API's path, not provisioning
        managers = [ManagerProcess(stack, f"quota-{n}") for n in range(args.replicas)]
        for manager in managers:
            wait_for(manager.ready, 120, f"{manager.name} /readyz", 0.2)
        reader_token = dev.add_consumer(rest, "quota-reader", None)
        wait_for(
            lambda: all(
                m.ready() and _status(m, "PUT", "/v1/databases/read-me", reader_token) in (200, 201) for m in managers
            ),
            60,
            "the reader's database",
            0.2,
        )

        def get_round() -> tuple[Counter[int], list[float]]:
            calls = [
                request(managers[i % len(managers)], "GET", "/v1/databases/read-me", reader_token)
                for i in range(args.puts)
            ]
            return concurrent(calls)

        rounds: list[tuple[str, Counter[int], list[float]]] = []
        bursts: list[Burst] = []
        log("g0")
        rounds.append(("g0", *get_round()))
        for n in range(args.bursts):
            consumer = f"quota-burst-{n}"
            token = dev.add_consumer(rest, consumer, args.max_databases)

            def everywhere(t: str = token) -> bool:
                return all(_status(m, "GET", "/v1/databases", t) == 200 for m in managers)

            wait_for(everywhere, 60, f"{consumer} on every replica", 0.1)
            before, latency_before = ledger_requests(stack), write_latency(stack)
            log(f"p{n}: {args.puts} PUTs")
            calls = [
                request(managers[i % len(managers)], "PUT", f"/v1/databases/burst-{i}", token) for i in range(args.puts)
            ]
            statuses, latencies = concurrent(calls)
            ledger = counter_delta(ledger_requests(stack), before)
            latency = write_latency(stack)
            mean_ms = {
                what: 1000
                * (latency[f"{what} sum"] - latency_before[f"{what} sum"])
                / max(1, latency[f"{what} count"] - latency_before[f"{what} count"])
                for what in ("Database POST", "ledger PATCH")
            }
            rounds.append((f"p{n}", statuses, latencies))
            bursts.append(
                {
                    "statuses": statuses,
                    "created": count_databases(rest, dev.namespace, consumer),
                    "ledger": ledger,
                    "latency": mean_ms,
                }
            )
            log(f"g{n + 1}")
            rounds.append((f"g{n + 1}", *get_round()))

        table(
            "rounds (each request on a new TLS connection)",
            [
                (
                    name,
                    ", ".join(f"{code}: {n}" for code, n in sorted(statuses.items())),
                    fmt_s(percentile(lat, 50)),
                    fmt_s(percentile(lat, 99)),
                    fmt_s(max(lat)),
                )
                for name, statuses, lat in rounds
            ],
            ("round", "answers", "p50", "p99", "max"),
        )
        table(
            "quota ledger requests per burst (ConfigMap verb and code, apiserver_request_total)",
            [
                (f"p{n}", burst["created"], ", ".join(f"{k}: {v}" for k, v in sorted(burst["ledger"].items())))
                for n, burst in enumerate(bursts)
            ],
            ("burst", "databases created", "ledger requests"),
        )
        table(
            "the apiserver's own time per write during the burst (mean, apiserver_request_duration_seconds)",
            [
                (f"p{n}", f"{burst['latency']['Database POST']:.0f} ms", f"{burst['latency']['ledger PATCH']:.0f} ms")
                for n, burst in enumerate(bursts)
            ],
            ("burst", "Database POST", "ledger PATCH"),
        )

        ratios = []
        for n in range(args.bursts):
            p99_put = percentile(rounds[2 * n + 1][2], 99)
            p99_get = statistics.mean([percentile(rounds[2 * n][2], 99), percentile(rounds[2 * n + 2][2], 99)])
            ratios.append(p99_put / p99_get)
        exact = [
            b["created"] == args.max_databases
            and b["statuses"] == {201: args.max_databases, 429: args.puts - args.max_databases}
            for b in bursts
        ]
        ratio = statistics.median(ratios)
        report_targets(
            [
                Target(
                    f"bursts creating exactly {args.max_databases} and answering {args.puts - args.max_databases} "
                    f"with 429: {sum(exact)} of {len(exact)}",
                    "all",
                    all(exact),
                    key="exact",
                    what=(
                        "bursts of 200 PUTs of one consumer over 3 replicas creating exactly maxDatabases, the rest 429"
                    ),
                    value=sum(exact),
                    unit=f"of {len(exact)} bursts",
                ),
                Target(
                    f"p99 of the create answers / p99 of authenticated GETs {ratio:.2f}x (bursts: "
                    f"{', '.join(f'{r:.2f}' for r in ratios)})",
                    f"<= {TARGET_RATIO:.0f}x",
                    ratio <= TARGET_RATIO,
                    key="p99-ratio",
                    what="p99 of a burst's creates, over the p99 of authenticated GETs (median of the bursts)",
                    value=ratio,
                    unit="x",
                ),
            ],
            ResultsFiles.of("bench.quota", args, argv),
        )
    finally:
        stack.close(*managers)
    return 0


def _status(manager: ManagerProcess, method: str, path: str, token: str) -> int:
    try:
        return request(manager, method, path, token)(requests.Session()).status_code
    except requests.RequestException:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
