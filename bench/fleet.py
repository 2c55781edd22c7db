"""Fleet: a burst over 20 shards in another zone, against the same SQL on 4 sessions per shard.

    python -m bench.fleet [--shards 20] [--count 1000] [--delay 0.010] [--sessions 4] [--clients 50]
                          [--consumers 20] [--shared-cpus]

Every shard is its own PostgreSQL 18 server (small settings: the RSS of all of them is reported)
behind a TCP proxy that adds `--delay` each way (`harness.latency_proxy`, one process for all), so
each round trip to a shard costs 20 ms more, as to a shard in another zone. The manager's admin
sessions reach the shards only through the proxies, and so do the baselines'; the login as a new
tenant goes to the Shard's client endpoint (the server itself) in both. One run, in this order:

- warm-up (not timed): 10 tenants per shard, dropped again (the first round on fresh servers is slower).
- b0, b1 (baselines): `ensure_tenant` (with the ownership record, exactly the SQL the controller
  sends for a new database) and a login as the new tenant on a fresh TLS session (what the product
  does before Ready) for `count / shards` fresh tenants per shard, `--sessions` admin sessions per
  shard, every shard at once; time until the last one is done.
- r0 (burst), between b0 and b1: `count` PUTs from `--clients` keep-alive TLS clients to the API,
  of `--consumers` consumers (the API creates one consumer's databases one at a time, for its exact
  quota: a fleet's burst comes from many consumers), spread over the shards by placement; time
  from the first PUT until every database is Ready (seen through a watch). Ratio: r0 / mean(b0, b1).
- r1 (burst with a hung shard): one shard's server is frozen (SIGSTOP of the postmaster and every
  backend) right before the first PUT and stays so; the same burst. The databases placed on the
  other shards: time from the first PUT until all of them are Ready. Its baselines, on those shards
  only: b2 right before it (the burst's count spread evenly over them: what r1 places if none is
  stuck on the hung shard) and b3 right after it (as many tenants on each as r1 placed there).
  Ratio: that time / mean(b2, b3). Like every burst, r1 sits between two baselines: a shared
  machine's speed drifts within minutes (one b3-like baseline alone once cost PostgreSQL a third
  less CPU per database than the baselines ten minutes earlier).

Between phases every tenant is dropped (not timed) so the shards' disks stay small. Reported also:
placements per shard, CPU per component, per phase the provisioner's statements per database (refused
loudly if the log shows none), when each shard's last database was done and PostgreSQL's CPU per
database (is the baseline the same work as the burst?), the peak of
`dbprovider_database_workers_in_flight` per shard and in all during r1. Targets: both ratios <= 1.5x.

Topology (bench.common `ShardCpus`): the 20 servers run on the last CPU, the apiserver, etcd, the manager,
the proxy and the clients on the others, baselines and bursts alike: shards in another zone share no CPU
with the control plane. `--shared-cpus` puts everything on every CPU: the burst then also pays for the
control plane's CPU, which the baselines do not use (docs/performance.md section 8).
"""

from __future__ import annotations

import os
import queue
import secrets
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.bursts import BurstCost, start_manager
from bench.common import (
    ApiserverRequests,
    CpuMeter,
    ManagerProcess,
    ProvisionerStatements,
    ReadyWatch,
    ResultsFiles,
    Stack,
    Target,
    add_topology_option,
    add_worker_options,
    bench_owner,
    bench_parser,
    drop_all_tenants,
    fmt_s,
    least_seconds,
    log,
    log_in_as_tenant,
    machine_line,
    metric_sum,
    put_all,
    report_targets,
    run_on_sessions,
    summarize_collapsed,
    table,
    topology,
    wait_for,
    worker_experiment,
)
from domain.constants import (
    API_VERSION,
    DEFAULT_TOKEN_KEY,
    KIND_CONSUMER,
    KIND_SHARD,
    UNPLACED,
)
from domain.credentials import new_password, opaque_secret
from domain.resources import CONSUMERS, SHARDS
from domain.tokens import hash_token
from harness import PostgresServer
from harness.background import Background
from harness.latency_proxy import LatencyProxy
from informers import SECRETS, Rest
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant

TARGET_RATIO = 1.5
SHARD_PREFIX = "fleet"
# Twenty servers on a 2-core machine: small buffers. Placement counts connections (the Shard's
# budget: max_connections less the reserve and the provider's own sessions), and the databases of
# r0 stay placed during r1: up to about 105 per shard, of size class small at 1 connection each.
SMALL_SERVER = {"shared_buffers": "16MB", "max_connections": "150", "wal_buffers": "512kB", "work_mem": "1MB"}
SIZE_CLASSES = {"sizeClasses": {"small": {"connectionLimit": 1}}}


@dataclass
class Fleet:
    """The shards: name -> server, and the proxy in front of all of them."""

    servers: dict[str, PostgresServer]
    proxy: LatencyProxy
    secrets_namespace: str
    extra: list[PostgresServer] = field(default_factory=list)  # servers this benchmark started

    def endpoint(self, shard: str) -> AdminEndpoint:
        server = self.servers[shard]
        port = self.proxy.port_of(server.port)
        return AdminEndpoint("127.0.0.1", port, server.PROVISIONER, server.provisioner_password, sslmode="require")

    def secret_name(self, shard: str) -> str:
        return f"{shard}-provisioner"

    def stop(self) -> None:
        self.proxy.stop()
        for server in self.extra:
            server.close()


def shard_names(count: int) -> list[str]:
    return [f"{SHARD_PREFIX}-{i:02d}" for i in range(count)]


def fleet_config(names: list[str], namespace: str) -> dict[str, Any]:
    """The install config's shardSecrets for the fleet's admin Secrets (the provider reads only listed ones)."""
    return {"shardSecrets": [{"namespace": namespace, "name": f"{name}-provisioner"} for name in names]}


def start_servers(stack: Stack, names: list[str], delay: float) -> Fleet:
    """The stack's server as the first shard, one more server per other shard, the proxy for all."""
    log(f"starting {len(names) - 1} more PostgreSQL 18 servers")
    # From this thread: a harness process dies with the thread that started it (PR_SET_PDEATHSIG).
    extra = [PostgresServer("18", log_statements=True, settings=SMALL_SERVER).start() for _ in names[1:]]
    servers = dict(zip(names, [stack.postgres, *extra], strict=True))
    proxy = LatencyProxy([s.port for s in servers.values()], delay, stack.state_dir / "latency-proxy.log").start()
    return Fleet(servers, proxy, stack.dev.shard_secrets_namespace, extra)


def register_shards(rest: Rest, fleet: Fleet, max_databases: int, dev_shard: str) -> None:
    """One Shard per server, its admin endpoint the proxy; the DevStack's own Shard (direct) goes."""
    rest.delete(SHARDS, dev_shard)
    for name, server in fleet.servers.items():
        rest.create(
            SECRETS,
            opaque_secret(
                fleet.secret_name(name),
                fleet.secrets_namespace,
                {"user": server.PROVISIONER, "password": server.provisioner_password},
            ),
            fleet.secrets_namespace,
        )
        rest.create(
            SHARDS,
            {
                "apiVersion": API_VERSION,
                "kind": KIND_SHARD,
                "metadata": {"name": name},
                "spec": {
                    "maxDatabases": max_databases,
                    "perconaCluster": {"namespace": "databases", "name": name},
                    "admin": {
                        "serviceName": f"{name}-primary",
                        "port": fleet.proxy.port_of(server.port),
                        "sslmode": "require",
                        "secretRef": {"namespace": fleet.secrets_namespace, "name": fleet.secret_name(name)},
                    },
                    "client": {"host": "127.0.0.1", "port": server.port, "sslmode": "require"},
                },
            },
        )


# -- baselines ---------------------------------------------------------------------------------


@dataclass
class Phase:
    seconds: float
    cpu: dict[str, float]
    machine_cpu: float
    statements: Counter[str]
    databases: int = 0
    finished: dict[str, float] = field(default_factory=dict)  # shard -> release to its last tenant done


def baseline(fleet: Fleet, label: str, per_shard: dict[str, int], sessions: int, meter: CpuMeter) -> Phase:
    """ensure_tenant and a login as the tenant for per_shard[s] new tenants on each shard s, `sessions`
    sessions per shard, all at once."""
    work: dict[str, queue.Queue[TenantSpec]] = {}
    shard_of: dict[str, str] = {}  # tenant -> its shard
    for shard, count in per_shard.items():
        work[shard] = queue.Queue()
        for i in range(count):
            spec = TenantSpec(f"t_{label}_{shard.replace('-', '_')}_{i:04d}", new_password(), 5, owner=bench_owner())
            work[shard].put(spec)
            shard_of[spec.name] = shard
    jobs = [
        (AdminSession.for_endpoint(fleet.endpoint(shard)), work[shard]) for shard in per_shard for _ in range(sessions)
    ]
    first_start: list[float] = []
    done_at: dict[str, float] = {}
    lock = threading.Lock()

    def provision(admin: AdminSession, spec: TenantSpec) -> None:
        first_start.append(time.perf_counter())  # the earliest is the release (within microseconds)
        shard = shard_of[spec.name]
        ensure_tenant(admin, spec)
        log_in_as_tenant(fleet.servers[shard], spec)  # the Shard's client endpoint: direct
        with lock:
            done_at[shard] = max(done_at.get(shard, 0.0), time.perf_counter())

    statements = ProvisionerStatements(*(fleet.servers[s] for s in per_shard))
    timed = run_on_sessions(jobs, provision, label, meter)
    found = statements.expect(f"baseline {label} (ensure_tenant x{sum(per_shard.values())})")
    released = min(first_start)
    return Phase(
        timed.seconds,
        timed.cpu,
        timed.machine_cpu,
        found,
        sum(per_shard.values()),
        {shard: at - released for shard, at in done_at.items()},
    )


# -- bursts ------------------------------------------------------------------------------------


@dataclass
class Burst:
    started: float
    answered: float  # first PUT -> every PUT answered
    answers: Counter[str]
    ids: set[str]
    cpu: dict[str, float]
    machine_cpu: float
    statements: Counter[str]
    ready_seconds: float = 0.0  # first PUT -> the last database of interest Ready
    in_flight_peak: dict[str, float] = field(default_factory=dict)
    waiting_peak: dict[str, float] = field(default_factory=dict)
    passes: float = 0.0  # Database reconciles during the burst
    requests: ApiserverRequests = field(default_factory=ApiserverRequests)
    finished: dict[str, float] = field(default_factory=dict)  # shard -> first PUT to its last database Ready
    total_in_flight_peak: float = 0.0  # every lane together (the global bound: workersTotal)
    shard_passes: float = 0.0  # Shard reconciles during the burst
    consumer_passes: float = 0.0  # Consumer reconciles during the burst


def create_consumers(rest: Rest, namespace: str, count: int, max_databases: int) -> list[str]:
    """`count` Consumers with a fresh token each (its hash in a Secret, as `dbprovider consumer new`
    writes it); returns the tokens."""
    tokens = []
    for i in range(count):
        name, token = f"{SHARD_PREFIX}-consumer-{i:02d}", secrets.token_hex(32)
        rest.create(
            SECRETS, opaque_secret(f"{name}-token", namespace, {DEFAULT_TOKEN_KEY: hash_token(token)}), namespace
        )
        rest.create(
            CONSUMERS,
            {
                "apiVersion": API_VERSION,
                "kind": KIND_CONSUMER,
                "metadata": {"name": name},
                "spec": {
                    "tokenSecretRef": {"namespace": namespace, "name": f"{name}-token", "key": DEFAULT_TOKEN_KEY},
                    "maxDatabases": max_databases,
                },
            },
        )
        tokens.append(token)
    return tokens


class InFlightSampler(Background):
    """The peaks of dbprovider_database_workers_in_flight and dbprovider_database_queue_depth per lane
    (each shard, and `unplaced`: placement), from the manager's /metrics every 0.5 s."""

    join_timeout = 5.0

    def __init__(self, manager: ManagerProcess, shards: list[str]) -> None:
        super().__init__()
        self.manager = manager
        self.shards = [*shards, UNPLACED]
        self.peak: dict[str, float] = dict.fromkeys(self.shards, 0.0)
        self.waiting_peak: dict[str, float] = dict.fromkeys(self.shards, 0.0)
        self.total_peak = 0.0

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                text = self.manager.metrics()
            except requests.RequestException:
                continue
            self.total_peak = max(self.total_peak, metric_sum(text, "dbprovider_database_workers_in_flight"))
            for shard in self.shards:
                value = metric_sum(text, "dbprovider_database_workers_in_flight", shard=shard)
                self.peak[shard] = max(self.peak[shard], value)
                waiting = metric_sum(text, "dbprovider_database_queue_depth", shard=shard)
                self.waiting_peak[shard] = max(self.waiting_peak[shard], waiting)


def run_burst(
    stack: Stack,
    fleet: Fleet,
    manager: ManagerProcess,
    watch: ReadyWatch,
    label: str,
    count: int,
    clients: int,
    tokens: list[str],
    meter: CpuMeter,
    hung: str | None = None,
    spy_out: Path | None = None,
) -> Burst:
    ids = [f"{label}-{i:04d}" for i in range(count)]
    statements = ProvisionerStatements(*(s for n, s in fleet.servers.items() if n != hung))
    with BurstCost(stack, manager, meter, spy_out) as cost, InFlightSampler(manager, list(fleet.servers)) as sampler:
        if hung is not None:
            fleet.servers[hung].freeze()
        started, answered, answers, _ = put_all(manager, tokens, ids, clients)
        log(f"burst {label}: all {count} PUTs answered after {answered:.1f} s; waiting for Ready")
        wanted = set(ids)
        if hung is not None:  # every database placed elsewhere (placement is done once all are placed)
            wait_for(lambda: len(watch.shard_of.keys() & wanted) == count, 300, f"{count} databases placed", 0.1)
            wanted = {i for i in ids if watch.shard_of[i] != hung}
        wait_for(lambda: watch.count(wanted) == len(wanted), 1800, f"{len(wanted)} databases Ready", 0.05)
        cpu, busy = cost.cpu()
    ready = max(watch.ready_at[i] for i in wanted) - started
    finished: dict[str, float] = {}
    for i in wanted:
        finished[watch.shard_of[i]] = max(finished.get(watch.shard_of[i], 0.0), watch.ready_at[i] - started)
    requests_made = cost.requests()
    return Burst(
        started,
        answered,
        answers,
        set(ids),
        cpu,
        busy,
        statements.expect(f"burst {label} ({len(wanted)} new databases)"),
        ready,
        sampler.peak,
        sampler.waiting_peak,
        cost.passes(),
        requests_made,
        finished,
        sampler.total_peak,
        cost.passes("shard"),
        cost.passes("consumer"),
    )


def spread(count: int, shards: list[str]) -> dict[str, int]:
    """`count` databases spread evenly over `shards` (placement's even spread), the first ones one more."""
    return {name: count // len(shards) + (n < count % len(shards)) for n, name in enumerate(shards)}


def placed_per_shard(watch: ReadyWatch, ids: set[str]) -> Counter[str]:
    return Counter(watch.shard_of[i] for i in ids if i in watch.shard_of)


def servers_memory(fleet: Fleet) -> tuple[float, float]:
    """(PSS, RSS) in MB of every process of every server (shared memory counted once in PSS)."""
    pss = rss = 0.0
    for server in fleet.servers.values():
        if server.pid is None:
            continue
        postmaster = psutil.Process(server.pid)
        for proc in [postmaster, *postmaster.children(recursive=True)]:
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            pss += info.pss
            rss += info.rss
    return pss / 2**20, rss / 2**20


def cleanup(servers: list[PostgresServer]) -> None:
    with ThreadPoolExecutor(4) as pool:
        dropped = sum(pool.map(drop_all_tenants, servers))
    log(f"dropped {dropped} databases (not timed)")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        __doc__, profile="record where the manager's CPU goes (py-spy, on-CPU samples) during burst r0"
    )
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--count", type=int, default=1000, help="PUTs per burst (default 1000)")
    parser.add_argument("--delay", type=float, default=0.010, help="seconds the proxy adds each way (default 0.010)")
    parser.add_argument("--sessions", type=int, default=4, help="baseline sessions per shard (default 4)")
    parser.add_argument("--clients", type=int, default=50, help="keep-alive API clients of a burst (default 50)")
    parser.add_argument("--consumers", type=int, default=20, help="consumers the PUTs come from (default 20)")
    add_topology_option(parser)
    add_worker_options(parser)
    args = parser.parse_args(argv)
    names = shard_names(args.shards)
    per_shard = -(-args.count // args.shards)

    print(
        f"fleet: {args.count} PUTs of {args.consumers} consumers over {args.shards} shards, each behind a proxy "
        f"adding {1000 * args.delay:.0f} ms each way, vs ensure_tenant on {args.sessions} sessions per shard"
    )
    print(f"machine: {machine_line()}")
    shard_cpus = topology(args)
    experiment = worker_experiment(args)
    stack = Stack(
        "fleet",
        log_statements=True,
        postgres_settings=SMALL_SERVER,
        config={**fleet_config(names, "dbprovider-shards"), **SIZE_CLASSES, **experiment},
    )
    fleet: Fleet | None = None
    manager: ManagerProcess | None = None
    watch: ReadyWatch | None = None
    try:
        if shard_cpus is not None:
            shard_cpus.pin_this_process()
        dev = stack.start_dev()
        fleet = start_servers(stack, names, args.delay)
        if shard_cpus is not None:
            shard_cpus.pin_postgres(*fleet.servers.values())
        rest = stack.admin_rest()
        register_shards(rest, fleet, 2 * per_shard + 10, dev.shard)
        tokens = create_consumers(rest, dev.namespace, args.consumers, 2 * -(-args.count // args.consumers) + 10)
        pss, rss = servers_memory(fleet)
        log(f"{args.shards} servers: {pss:.0f} MB PSS ({rss:.0f} MB RSS summed)")
        meter = CpuMeter(extra={"latency proxy": fleet.proxy.pid or 0})
        even = dict.fromkeys(names, per_shard)

        log("warm-up (not timed): 10 tenants per shard")  # the first round on fresh servers is slower
        baseline(fleet, "warm", dict.fromkeys(names, 10), args.sessions, meter)
        cleanup(list(fleet.servers.values()))
        log("baseline b0")
        b0 = baseline(fleet, "b0", even, args.sessions, meter)
        log(f"baseline b0: {b0.seconds:.1f} s")
        cleanup(list(fleet.servers.values()))
        manager, watch = start_manager(stack, rest, names, "fleet-manager")
        meter.manager_pid = manager.pid
        spy_out = None
        if args.profile:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            spy_out = args.profile_dir / "fleet-manager.pyspy.txt"
        r0 = run_burst(stack, fleet, manager, watch, "r0", args.count, args.clients, tokens, meter, spy_out=spy_out)
        log(f"burst r0: all Ready after {r0.ready_seconds:.1f} s")
        idle_pss, idle_rss = servers_memory(fleet)
        r0_placed = placed_per_shard(watch, r0.ids)
        cleanup(list(fleet.servers.values()))  # the Database objects stay (Ready, tenants gone): they only count
        log("baseline b1")
        b1 = baseline(fleet, "b1", even, args.sessions, meter)
        log(f"baseline b1: {b1.seconds:.1f} s")
        cleanup(list(fleet.servers.values()))

        hung, healthy = names[0], names[1:]
        log("baseline b2 (the other shards, the burst's count spread evenly over them)")
        b2 = baseline(fleet, "b2", spread(args.count, healthy), args.sessions, meter)
        log(f"baseline b2: {b2.seconds:.1f} s")
        cleanup([fleet.servers[n] for n in healthy])
        r1 = run_burst(stack, fleet, manager, watch, "r1", args.count, args.clients, tokens, meter, hung=hung)
        r1_placed = placed_per_shard(watch, r1.ids)
        log(f"burst r1 ({hung} hung): the other shards' databases Ready after {r1.ready_seconds:.1f} s")
        others = {name: n for name, n in r1_placed.items() if name != hung}
        stuck = r1_placed.get(hung, 0)
        cleanup([fleet.servers[n] for n in healthy])
        log("baseline b3 (the other shards, as many tenants as r1 placed on each)")
        b3 = baseline(fleet, "b3", others, args.sessions, meter)
        log(f"baseline b3: {b3.seconds:.1f} s")
        fleet.servers[hung].thaw()
        manager.stop()
        manager = None

        ratio0 = r0.ready_seconds / statistics.mean([b0.seconds, b1.seconds])
        ratio1 = r1.ready_seconds / statistics.mean([b2.seconds, b3.seconds])
        r1_count = sum(others.values())
        table(
            "times",
            [
                ("baseline b0 (all shards)", fmt_s(b0.seconds), f"{args.count / b0.seconds:.1f} db/s", ""),
                (
                    "burst r0: first PUT -> all Ready",
                    fmt_s(r0.ready_seconds),
                    f"{args.count / r0.ready_seconds:.1f} db/s",
                    f"{ratio0:.2f}x of b0/b1",
                ),
                ("baseline b1 (all shards)", fmt_s(b1.seconds), f"{args.count / b1.seconds:.1f} db/s", ""),
                (
                    f"baseline b2 ({len(healthy)} shards, {b2.databases} spread evenly)",
                    fmt_s(b2.seconds),
                    f"{b2.databases / b2.seconds:.1f} db/s",
                    "",
                ),
                (
                    f"burst r1, {hung} hung: first PUT -> the other {len(others)} shards' {r1_count} Ready",
                    fmt_s(r1.ready_seconds),
                    f"{r1_count / r1.ready_seconds:.1f} db/s",
                    f"{ratio1:.2f}x of b2/b3 ({r1.ready_seconds / b2.seconds:.2f}x, "
                    f"{r1.ready_seconds / b3.seconds:.2f}x)",
                ),
                (
                    f"baseline b3 ({len(others)} shards, r1's counts)",
                    fmt_s(b3.seconds),
                    f"{b3.databases / b3.seconds:.1f} db/s",
                    "",
                ),
                ("r0: all PUTs answered", fmt_s(r0.answered), "", ""),
                ("r1: all PUTs answered", fmt_s(r1.answered), "", ""),
            ],
            ("what", "time", "rate", "ratio"),
        )
        table(
            "placements per shard (r0 | r1) and the peak of dbprovider_database_workers_in_flight during r1",
            [
                (name, r0_placed.get(name, 0), r1_placed.get(name, 0), f"{r1.in_flight_peak.get(name, 0):.0f}")
                for name in names
            ],
            ("shard", "r0", "r1", "r1 in flight (peak)"),
        )
        print(f"\n{stuck} databases of r1 were placed on {hung} before it was found hung; they wait for it.")
        placing = {n: (b.in_flight_peak[UNPLACED], b.waiting_peak[UNPLACED]) for n, b in (("r0", r0), ("r1", r1))}
        shard_waiting = {
            n: max(v for k, v in b.waiting_peak.items() if k not in (UNPLACED, hung))
            for n, b in (("r0", r0), ("r1", r1))
        }
        print(
            f"placement lane ({UNPLACED}), peaks in flight / waiting: "
            + ", ".join(f"{n} {busy:.0f} / {waiting:.0f}" for n, (busy, waiting) in placing.items())
            + "; the most waiting in a healthy shard's lane (peak): "
            + ", ".join(f"{n} {v:.0f}" for n, v in shard_waiting.items())
            + "; every lane in flight together (peak; workersTotal bounds it): "
            + ", ".join(f"{n} {b.total_in_flight_peak:.0f}" for n, b in (("r0", r0), ("r1", r1)))
        )
        phases = {
            "b0": (b0.seconds, b0.cpu, b0.machine_cpu),
            "r0": (r0.ready_seconds, r0.cpu, r0.machine_cpu),
            "b1": (b1.seconds, b1.cpu, b1.machine_cpu),
            "b2": (b2.seconds, b2.cpu, b2.machine_cpu),
            "r1": (r1.ready_seconds, r1.cpu, r1.machine_cpu),
            "b3": (b3.seconds, b3.cpu, b3.machine_cpu),
        }
        components = sorted(
            {k for _, cpu, _ in phases.values() for k in cpu},
            key=lambda k: -sum(cpu.get(k, 0) for _, cpu, _ in phases.values()),
        )
        table(
            "CPU seconds per phase (the whole machine: 2 cores x wall; other tenants not shown)",
            [(k, *(f"{cpu.get(k, 0):.1f}" for _, cpu, _ in phases.values())) for k in components]
            + [
                ("machine busy", *(f"{busy:.1f}" for _, _, busy in phases.values())),
                ("wall x 2 cores", *(f"{2 * sec:.1f}" for sec, _, _ in phases.values())),
            ],
            ("component", *phases),
        )

        def ours(cpu: dict[str, float]) -> float:
            return sum(cpu.values())

        cpu0 = ours(r0.cpu) / statistics.mean([ours(b0.cpu), ours(b1.cpu)])
        cpu1 = ours(r1.cpu) / statistics.mean([ours(b2.cpu), ours(b3.cpu)])
        cores = len(os.sched_getaffinity(0) | (shard_cpus.shard if shard_cpus else set()))
        least0 = least_seconds(r0.cpu, cores, shard_cpus) / statistics.mean([b0.seconds, b1.seconds])
        least1 = least_seconds(r1.cpu, cores, shard_cpus) / statistics.mean([b2.seconds, b3.seconds])
        print(
            f"\nCPU of this benchmark's processes, burst / baseline: r0 {cpu0:.2f}x, r1 {cpu1:.2f}x; so the time is at "
            f"least r0 {least0:.2f}x, r1 {least1:.2f}x (the processes alone on the machine, every core busy)"
        )
        # What each phase asked of the shards it used: the same SQL per database, the same databases per
        # shard, the shards' pace (a straggler shard sets a phase's time) and PostgreSQL's CPU per database.
        work = {
            "b0": (b0.databases, b0.statements, b0.finished, b0.cpu),
            "r0": (args.count, r0.statements, r0.finished, r0.cpu),
            "b1": (b1.databases, b1.statements, b1.finished, b1.cpu),
            "b2": (b2.databases, b2.statements, b2.finished, b2.cpu),
            "r1": (r1_count, r1.statements, r1.finished, r1.cpu),
            "b3": (b3.databases, b3.statements, b3.finished, b3.cpu),
        }
        keywords = sorted({k for _, found, _, _ in work.values() for k in found})
        table(
            "provisioner statements per database (log_statement=all, jsonlog; r1: the other shards' databases)",
            [(k, *(f"{found.get(k, 0) / n:.2f}" for n, found, _, _ in work.values())) for k in keywords]
            + [("total", *(f"{sum(found.values()) / n:.2f}" for n, found, _, _ in work.values()))],
            ("keyword", *work),
        )
        table(
            "the shards of each phase: databases, seconds until each shard's last one was done "
            "(min / median / max over shards, the slowest), PostgreSQL CPU per database",
            [
                (
                    name,
                    len(done),
                    n,
                    f"{min(done.values()):.1f} / {statistics.median(done.values()):.1f} / {max(done.values()):.1f}",
                    max(done, key=lambda s: done[s]),
                    f"{1000 * cpu.get('postgres', 0.0) / n:.0f} ms",
                )
                for name, (n, _, done, cpu) in work.items()
            ],
            ("phase", "shards", "databases", "done after (s)", "slowest", "postgres CPU"),
        )
        print(
            "\nreconciles per new database, r0 / r1: "
            + ", ".join(
                f"{what} {getattr(r0, field) / args.count:.2f} / {getattr(r1, field) / args.count:.2f}"
                for what, field in (("Database", "passes"), ("Shard", "shard_passes"), ("Consumer", "consumer_passes"))
            )
        )
        writes, reads = r0.requests.writes, r0.requests.reads
        table(
            f"apiserver requests during burst r0 ({sum(writes.values()) / args.count:.2f} writes and "
            f"{sum(reads.values()) / args.count:.2f} reads per database; open watches not counted)",
            [(k, v, f"{v / args.count:.2f}") for k, v in (writes + reads).most_common()],
            ("resource verb", "requests", "per database"),
        )
        answers = r0.answers + r1.answers
        table("PUT answers, both bursts (incl. retries)", sorted(answers.items()), ("answer", "count"))
        table(
            f"the {args.shards} PostgreSQL servers ({SMALL_SERVER})",
            [
                ("PSS / RSS summed, before any work", f"{pss:.0f} MB", f"{rss:.0f} MB"),
                ("PSS / RSS summed, after burst r0 (sessions open)", f"{idle_pss:.0f} MB", f"{idle_rss:.0f} MB"),
            ],
            ("when", "PSS", "RSS"),
        )
        if spy_out is not None:
            print("\n== py-spy, manager process during burst r0 (on-CPU samples only)\n" + summarize_collapsed(spy_out))
        report_targets(
            [
                Target(
                    f"fleet burst / ensure_tenant baseline = {ratio0:.2f}x ({args.shards} shards, "
                    f"{1000 * args.delay:.0f} ms each way)",
                    f"<= {TARGET_RATIO}x",
                    ratio0 <= TARGET_RATIO,
                    key="burst-ratio",
                    what="1,000 PUTs over 20 shards 10 ms away, over the same SQL on 4 sessions per shard",
                    value=ratio0,
                    unit="x",
                ),
                Target(
                    f"fleet burst with {hung} hung: the other shards' databases / their baseline = {ratio1:.2f}x",
                    f"<= {TARGET_RATIO}x",
                    ratio1 <= TARGET_RATIO,
                    key="hung-shard-ratio",
                    what="1,000 PUTs with one of the 20 shards hung: the other shards' databases, over their baseline",
                    value=ratio1,
                    unit="x",
                ),
            ],
            ResultsFiles.of("bench.fleet", args, argv),
        )
    finally:
        if fleet is not None:
            for server in fleet.servers.values():
                server.thaw()
        stack.close(watch, manager, fleet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
