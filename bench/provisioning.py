"""Provisioning burst: N PUTs at once against a real `dbprovider manager`, vs the bare SQL.

    python -m bench.provisioning [--count 200] [--repeats 3] [--sessions 4] [--profile] [--shared-cpus]

Measured in one run on one PostgreSQL 18 server, alternating so that every burst has a baseline
right before and right after it (b0, r0, b1, r1, b2, r2, b3):
- baselines b<n>: `ensure_tenant` for N fresh tenants, each followed by a login as the new tenant on
  a fresh TLS session (what the product does before a database is Ready), run directly with 4
  parallel admin sessions (one shared queue, as the shard's 4 Database workers have); once at the start
  also the same with `set_password` before the login, for comparison (what the controller adds for
  an adopted tenant or a rotation; a new tenant gets its password with CREATE ROLE);
- bursts r<n>: N threads send `PUT /v1/databases/<id>` at once over TLS to the manager's API; the
  time from the first PUT until every Database is Ready (seen through a watch), p50/p99 of
  PUT->Ready per database, CPU per component, the apiserver's requests per database
  (apiserver_request_total before/after) and the provisioner's statements per database
  (log_statement=all).
Targets: the median over the bursts of (burst time / mean of its two neighbouring baselines) <= 1.25x,
and no connection error on the bursts' PUTs. Also printed: the CPU of this benchmark's processes in a
burst over its baselines', and the least time ratio that CPU allows on this machine's cores.

Topology (bench.common `ShardCpus`): PostgreSQL runs on the last CPU, the apiserver, etcd, the manager
and the clients on the others, baselines and bursts alike, as when the shard runs on nodes of its own.
`--shared-cpus` puts everything on every CPU: the control plane's CPU is then taken from the shard in the
bursts only, and the ratio measures the machine's cores more than the product (docs/performance.md section 1).
"""

from __future__ import annotations

import os
import queue
import shutil
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.bursts import BurstCost, start_manager
from bench.common import (
    ApiserverRequests,
    CpuMeter,
    ManagerProcess,
    ProvisionerStatements,
    ReadyWatch,
    ResultsFiles,
    ShardCpus,
    Stack,
    Target,
    add_topology_option,
    add_worker_options,
    bench_owner,
    bench_parser,
    fmt_s,
    least_seconds,
    log,
    log_in_as_tenant,
    machine_line,
    percentile,
    put_all,
    report_targets,
    run_on_sessions,
    summarize_collapsed,
    table,
    topology,
    wait_for,
    worker_experiment,
)
from domain.credentials import new_password
from domain.resources import CONSUMERS, SHARDS
from reconciler.sql.session import AdminEndpoint, AdminSession
from reconciler.sql.tenant import TenantSpec, ensure_tenant, set_password

TARGET_RATIO = 1.25


@dataclass
class Phase:
    seconds: float
    cpu: dict[str, float]  # CPU seconds by component (this benchmark's processes)
    machine_cpu: float  # CPU seconds the whole machine was busy (every tenant)

    @property
    def postgres_cpu(self) -> float:
        return self.cpu.get("postgres", 0.0)


# Disk for the databases the benchmark keeps until it ends (its server lives in the temp directory): an empty
# database copied from template0 is 7.4 MB on PostgreSQL 18, and CREATE DATABASE writes it to the WAL too, which
# max_wal_size (1 GB) lets grow to about twice that between checkpoints.
DATABASE_BYTES = 7_500_000
WAL_BYTES = 2_000_000_000


def check_disk(databases: int, directory: str | None = None) -> None:
    """Refuse to start when the temp directory cannot hold `databases` databases: a run that fills the disk
    fails minutes in, with disk_full on every create, after its figures are spoilt."""
    where = directory or tempfile.gettempdir()
    needed = databases * DATABASE_BYTES + WAL_BYTES
    free = shutil.disk_usage(where).free
    if free < needed:
        raise SystemExit(
            f"bench.provisioning keeps its {databases} databases until it ends: it needs about "
            f"{needed / 1e9:.1f} GB free in {where}, and {free / 1e9:.1f} GB are (TMPDIR picks another place)"
        )


def baseline(
    stack: Stack, label: str, count: int, sessions: int, set_new_password: bool = False
) -> tuple[Phase, Counter[str]]:
    """ensure_tenant (then set_password, with `set_new_password`) and a login as the tenant (the
    product's check that a new database is usable, through the DevStack's client endpoint: TLS) for
    `count` new tenants over `sessions` admin sessions sharing one queue; returns (seconds,
    statements by keyword)."""
    pg = stack.postgres
    # Without TLS, as before the TLS rule: the figures measure the SQL, compared with the earlier runs.
    endpoint = AdminEndpoint(
        "127.0.0.1", pg.port, pg.PROVISIONER, pg.provisioner_password, sslmode="disable", cleartext_allowed=True
    )
    work: queue.Queue[TenantSpec] = queue.Queue()
    for i in range(count):  # with the ownership record the controller writes (BEGIN, CREATE ROLE, COMMENT, COMMIT)
        work.put(TenantSpec(f"t_bench_{label}_{i:04d}", new_password(), 5, owner=bench_owner()))
    jobs = [(AdminSession.for_endpoint(endpoint), work) for _ in range(sessions)]

    def provision(admin: AdminSession, spec: TenantSpec) -> None:
        ensure_tenant(admin, spec)
        if set_new_password:
            set_password(admin, spec.name, spec.password)
        log_in_as_tenant(pg, spec)

    statements = ProvisionerStatements(pg)
    timed = run_on_sessions(jobs, provision, label, CpuMeter())
    return Phase(timed.seconds, timed.cpu, timed.machine_cpu), statements.expect(
        f"baseline {label} (ensure_tenant x{count})", detail=True
    )


def _by_keyword(detail: Counter[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for text, n in detail.items():
        found[text.split()[0].upper()] += n
    return found


@dataclass
class BurstResult:
    seconds: float  # first PUT -> all Ready
    latencies: list[float]  # PUT -> Ready, per database
    answered: float  # first PUT -> every PUT answered
    answers: Counter[str]
    cpu: dict[str, float]
    machine_cpu: float
    requests: ApiserverRequests
    statements: Counter[str]  # by statement text
    passes: float  # Database reconciles (dbprovider_reconciles_total) during the burst


def run_burst(
    stack: Stack,
    manager: ManagerProcess,
    watch: ReadyWatch,
    label: str,
    count: int,
    spy_out: Path | None,
    clients: int | None = None,
    cpu_only: bool = False,
) -> BurstResult:
    statements = ProvisionerStatements(stack.postgres)
    with BurstCost(stack, manager, CpuMeter(manager.pid), spy_out, idle=not cpu_only) as cost:
        names = [f"burst-{label}-{i:04d}" for i in range(count)]
        # Every PUT on a connection of its own, all at once; or `clients` keep-alive connections.
        started, answered, answers, sent = put_all(manager, [stack.dev.token], names, clients or count)
        ids = set(sent)
        log(f"burst {label}: all PUTs answered after {answered:.2f} s; waiting for Ready")
        wait_for(lambda: watch.count(ids) == len(ids), 900, f"{count} databases Ready", 0.05)
        seconds = max(watch.ready_at[i] for i in ids) - started
        cpu_used, busy = cost.cpu()
    time.sleep(5.0)  # the writes that follow Ready (counts on the Consumer and the Shard, events)
    return BurstResult(
        seconds=seconds,
        latencies=[watch.ready_at[i] - sent[i] for i in ids],
        answered=answered,
        answers=answers,
        cpu=cpu_used,
        machine_cpu=busy,
        requests=cost.requests(),
        statements=statements.expect(f"burst {label} ({count} new databases)", detail=True),
        passes=cost.passes(),
    )


def _cpu_floor(bursts: list[BurstResult], baselines: list[Phase], cores: int, pinned: ShardCpus | None) -> str:
    """What the machine allows: a burst cannot end before its processes' CPU has run (`least_seconds`), so
    that time over its baselines' is the lowest ratio this machine can show; the burst adds the apiserver,
    etcd and the manager's own work to the same SQL."""
    lines = []
    for n, b in enumerate(bursts):
        around = baselines[n : n + 2]
        floor = least_seconds(b.cpu, cores, pinned) / statistics.mean(p.seconds for p in around)
        more = sum(b.cpu.values()) / statistics.mean(sum(p.cpu.values()) for p in around)
        lines.append(f"r{n} {more:.2f}x the CPU, so at least {floor:.2f}x the time")
    return (
        f"\nthis benchmark's processes, burst / its baselines: {'; '.join(lines)} (the least: every core "
        "busy from the first PUT to the last Ready)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, profile="record the manager (every thread) with py-spy during the last burst")
    parser.add_argument("--count", type=int, default=200, help="databases in each burst (default 200)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="bursts, each between two ensure_tenant baselines (default 3)"
    )
    parser.add_argument("--sessions", type=int, default=4, help="parallel sessions of the SQL baseline (default 4)")
    parser.add_argument(
        "--profile-cpu",
        action="store_true",
        help="with --profile: only the samples of threads on the CPU (where the CPU goes)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=None,
        help="experiment: N keep-alive clients share the PUTs (default: one connection per PUT)",
    )
    add_topology_option(parser)
    add_worker_options(parser)
    args = parser.parse_args(argv)
    count, repeats = args.count, args.repeats

    print(
        f"provisioning burst: {repeats} x {count} PUTs at once, each between two baselines of ensure_tenant "
        f"x{count} on {args.sessions} sessions"
    )
    if args.clients is not None:
        print(f"EXPERIMENT: {args.clients} keep-alive clients share the PUTs of a burst")
    experiment = worker_experiment(args)
    check_disk(count * (2 * repeats + 2))  # the baseline with set_password, repeats + 1 baselines, repeats bursts
    print(f"machine: {machine_line()}")
    cores = len(os.sched_getaffinity(0))
    shard_cpus = topology(args)
    # Placement counts connections (the Shard's budget, max_connections less the reserve): the 650 databases
    # of size class small at 1 connection each fit a server with max_connections 1000 (at 5 each in 200,
    # 38 were placed and the rest never got Ready).
    stack = Stack(
        "provisioning",
        log_statements=True,
        postgres_settings={"max_connections": "1000"},
        config={"sizeClasses": {"small": {"connectionLimit": 1}}, **experiment},
    )
    manager: ManagerProcess | None = None
    watch: ReadyWatch | None = None
    try:
        if shard_cpus is not None:
            shard_cpus.pin_this_process()
        dev = stack.start_dev()
        if shard_cpus is not None:
            shard_cpus.pin_postgres(stack.postgres)
        rest = stack.admin_rest()
        rest.patch(CONSUMERS, dev.consumer, {"spec": {"maxDatabases": repeats * count + 50}})
        rest.patch(SHARDS, dev.shard, {"spec": {"maxDatabases": repeats * count + 50}})

        log(f"baseline ensure+password x{count} (for comparison)")
        with_password, with_password_statements = baseline(stack, "pw", count, args.sessions, True)
        with_password_seconds = with_password.seconds
        ensure_phases: list[Phase] = []
        ensure_runs: list[float] = []
        ensure_statements: Counter[str] = Counter()

        def ensure_baseline(label: str) -> None:
            nonlocal ensure_statements
            phase, found = baseline(stack, label, count, args.sessions)
            ensure_phases.append(phase)
            ensure_runs.append(phase.seconds)
            ensure_statements = ensure_statements or found
            log(f"baseline ensure ({label}): {phase.seconds:.2f} s")

        ensure_baseline("b0")
        manager, watch = start_manager(stack, rest, [dev.shard], "bench-manager")
        bursts: list[BurstResult] = []
        for n in range(repeats):
            profile = args.profile and n == repeats - 1
            if profile:
                args.profile_dir.mkdir(parents=True, exist_ok=True)
            result = run_burst(
                stack,
                manager,
                watch,
                f"r{n}",
                count,
                args.profile_dir / "provisioning-manager.pyspy.txt" if profile else None,
                args.clients,
                args.profile_cpu,
            )
            bursts.append(result)
            log(f"burst r{n}: all Ready after {result.seconds:.2f} s")
            ensure_baseline(f"b{n + 1}")
        manager.stop()
        manager = None

        ratios = [b.seconds / statistics.mean(ensure_runs[n : n + 2]) for n, b in enumerate(bursts)]
        ratio = statistics.median(ratios)
        latencies = [x for b in bursts for x in b.latencies]
        rows = [
            (f"baseline ensure_tenant b{n}", fmt_s(sec), f"{count / sec:.1f} db/s", "")
            for n, sec in enumerate(ensure_runs)
        ]
        rows.append(
            (
                "baseline ensure_tenant + set_password (once)",
                fmt_s(with_password_seconds),
                f"{count / with_password_seconds:.1f} db/s",
                "",
            )
        )
        for n, b in enumerate(bursts):
            rows.append(
                (
                    f"burst r{n}: first PUT -> all Ready",
                    fmt_s(b.seconds),
                    f"{count / b.seconds:.1f} db/s",
                    f"{ratios[n]:.2f}x of b{n}/b{n + 1}",
                )
            )
        rows += [
            ("burst: all PUTs answered (median)", fmt_s(statistics.median(b.answered for b in bursts)), "", ""),
            ("PUT -> Ready p50 (all bursts)", fmt_s(percentile(latencies, 50)), "", ""),
            ("PUT -> Ready p99 (all bursts)", fmt_s(percentile(latencies, 99)), "", ""),
            ("PUT -> Ready max", fmt_s(max(latencies)), "", ""),
        ]
        table("times", rows, ("what", "time", "rate", "ratio"))

        phases = [(f"baseline b{n}", p.seconds, p.postgres_cpu, p.machine_cpu) for n, p in enumerate(ensure_phases)]
        phases.append(
            ("baseline + set_password", with_password.seconds, with_password.postgres_cpu, with_password.machine_cpu)
        )
        phases += [(f"burst r{n}", b.seconds, b.cpu.get("postgres", 0.0), b.machine_cpu) for n, b in enumerate(bursts)]
        table(
            "PostgreSQL CPU and how busy the machine was (2 cores = 200%; other tenants included)",
            [
                (name, fmt_s(sec), f"{pg_cpu:.1f}", f"{1000 * pg_cpu / count:.0f} ms", f"{100 * busy / sec:.0f}%")
                for name, sec, pg_cpu, busy in phases
            ],
            ("phase", "wall", "postgres CPU-s", "per database", "machine busy"),
        )
        components = sorted({k for b in bursts for k in b.cpu}, key=lambda k: -sum(b.cpu.get(k, 0) for b in bursts))
        table(
            "CPU seconds per burst, first PUT to all Ready (other tenants of the machine not shown)",
            [(k, *(f"{b.cpu.get(k, 0):.1f}" for b in bursts)) for k in components]
            + [("wall seconds x 2 cores", *(f"{2 * b.seconds:.1f}" for b in bursts))],
            ("component", *(f"r{n}" for n in range(repeats))),
        )
        print(_cpu_floor(bursts, ensure_phases, cores, shard_cpus))
        answers: Counter[str] = sum((b.answers for b in bursts), Counter())
        table("PUT answers, all bursts (incl. retries)", sorted(answers.items()), ("answer", "count"))
        writes: Counter[str] = sum((b.requests.writes for b in bursts), Counter())
        total = count * repeats
        total_writes = sum(writes.values())
        lease_writes = sum(v for k, v in writes.items() if k.startswith("leases "))
        table(
            f"apiserver writes during the bursts ({total_writes / total:.2f} per database; "
            f"{(total_writes - lease_writes) / total:.2f} without Lease renewals)",
            [(k, v, f"{v / total:.2f}") for k, v in writes.most_common()],
            ("resource verb", "requests", "per database"),
        )
        reads: Counter[str] = sum((b.requests.reads for b in bursts), Counter())
        table(
            f"apiserver reads during the bursts ({sum(reads.values()) / total:.2f} per database; open "
            "watches are counted when they end, so not here)",
            [(k, v, f"{v / total:.2f}") for k, v in reads.most_common()],
            ("resource verb", "requests", "per database"),
        )
        burst_detail: Counter[str] = sum((b.statements for b in bursts), Counter())
        by_kw = {
            "ensure": _by_keyword(ensure_statements),
            "ensure+password": _by_keyword(with_password_statements),
            "burst": _by_keyword(burst_detail),
        }
        per = {"ensure": count, "ensure+password": count, "burst": total}
        keys = sorted(set().union(*by_kw.values()))
        table(
            "provisioner statements per database (log_statement=all)",
            [(k, *(f"{by_kw[c].get(k, 0) / per[c]:.2f}" for c in by_kw)) for k in keys]
            + [("total", *(f"{sum(by_kw[c].values()) / per[c]:.2f}" for c in by_kw))],
            ("keyword", "baseline ensure", "baseline ensure+password", "bursts"),
        )
        selects = sorted(
            {k for k in burst_detail if k.startswith("SELECT")}
            | {k for k in with_password_statements if k.startswith("SELECT")}
        )
        table(
            "SELECT statements per database, by query",
            [
                (k, f"{with_password_statements.get(k, 0) / count:.2f}", f"{burst_detail.get(k, 0) / total:.2f}")
                for k in selects
            ],
            ("query (first 72 characters)", "baseline ensure+password", "bursts"),
        )
        if args.profile:
            print(
                "\n== py-spy, manager process during the last burst\n"
                + summarize_collapsed(args.profile_dir / "provisioning-manager.pyspy.txt")
            )
        print(f"\nDatabase reconciles per new database: {sum(b.passes for b in bursts) / total:.2f}")
        print(
            f"PUT->Ready p50 {percentile(latencies, 50):.2f} s  p99 {percentile(latencies, 99):.2f} s  "
            f"apiserver writes per database {total_writes / total:.2f} "
            f"({(total_writes - lease_writes) / total:.2f} without Lease renewals)"
        )
        connection_errors = sum(n for answer, n in answers.items() if answer.startswith("client error"))
        report_targets(
            [
                Target(
                    f"provisioning burst / ensure_tenant baseline = {ratio:.2f}x (median of "
                    f"{', '.join(f'{r:.2f}' for r in ratios)})",
                    f"<= {TARGET_RATIO}x",
                    ratio <= TARGET_RATIO,
                    key="burst-ratio",
                    what="200 PUTs at once until all Ready, over the same SQL on 4 sessions (median of the bursts)",
                    value=ratio,
                    unit="x",
                ),
                Target(
                    f"connection errors of the bursts' PUTs {connection_errors}",
                    "== 0",
                    connection_errors == 0,
                    key="connection-errors",
                    what="connection errors on the bursts' PUTs",
                    value=connection_errors,
                ),
            ],
            ResultsFiles.of("bench.provisioning", args, argv),
        )
    finally:
        stack.close(watch, manager)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
