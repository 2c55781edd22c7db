"""What every benchmark shares: the harness stack, a `dbprovider manager` process, counters, output.

Nothing here is a fake: `Stack` starts a real kube-apiserver + etcd and a real PostgreSQL 18 with the
harness and installs the product on them with `DevStack`; `ManagerProcess` runs `dbprovider manager`
as its own process (the kernel kills it if the benchmark dies). Every benchmark prints a table and
ends with one line per target (`<figure>  target <target>  PASS|FAIL`); the exit code is 0 either way.
Each target's figure is also written to its results file under bench/results/ (`report_targets`), from
which `python -m bench.report` generates the results table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fcntl
import json
import math
import os
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import requests
from psycopg import sql

from bench.report import RESULTS_DIR
from dbprovider.devstack import DevStack
from domain.config import InstallConfig
from domain.objects import Obj
from domain.resources import DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from harness.manager_endpoints import ManagerEndpoints
from harness.process import spawn
from harness.process import stop as stop_process
from harness.statement_log import LoggedStatement, StatementLog, keywords
from informers import LEASES, Informer, Rest
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import OwnerRecord, TenantSpec
from reconciler.sql.tenant_login import TenantLogin, log_in

if TYPE_CHECKING:
    # The bench extra; pyinstrument_profile imports it when it runs, and runs without it.
    from pyinstrument import Profiler

REPO = Path(__file__).resolve().parents[1]
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH"})
PROFILE_DIR = Path("bench/profiles")  # not committed
T = TypeVar("T")


def bench_parser(doc: str | None, *, profile: str | None = None, lock: str | None = None) -> argparse.ArgumentParser:
    """A bench's options, its module docstring as the description. A bench that profiles says what
    --profile records; where it writes (--profile-dir) is the same for all. A bench that takes the
    machine's benchmark lock itself (--lock, see `machine_lock`) says during what."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS_DIR,
        metavar="DIR",
        help=f"write each target's results file here (default {RESULTS_DIR.relative_to(REPO)})",
    )
    parser.add_argument("--no-results", dest="results", action="store_const", const=None, help="print the targets only")
    if profile is not None:
        parser.add_argument("--profile", action="store_true", help=profile)
        parser.add_argument(
            "--profile-dir", type=Path, default=PROFILE_DIR, help=f"where the profiles go (default {PROFILE_DIR})"
        )
    if lock is not None:
        parser.add_argument(
            "--lock", type=Path, metavar="PATH", help=f"hold this flock (e.g. /tmp/bench.lock) during {lock}"
        )
    return parser


@contextmanager
def machine_lock(path: Path | None, *, shared: bool = False) -> Iterator[None]:
    """Hold `flock(path)` while the body runs (the machine's benchmark lock, shared with other runs); no lock
    without a path. Exclusive for what is measured. `shared` for a long setup (30 minutes at 100,000): other
    setups may run beside it, but not a measurement, whose figures its load would skew (a `flock` from the
    shell, or another benchmark's measured part, waits for it, and it waits for them)."""
    if path is None:
        yield
        return
    mode, what = (fcntl.LOCK_SH, "shared, for the setup") if shared else (fcntl.LOCK_EX, "exclusive")
    with path.open("a") as handle:
        asked = time.monotonic()
        fcntl.flock(handle, mode)
        held = time.monotonic()
        log(f"holding {path} {what} (waited {held - asked:.0f} s; load {os.getloadavg()[0]:.1f})")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            log(f"released {path} after {time.monotonic() - held:.0f} s")


# The install config's worker bounds a bench may change for an experiment: (config key, InstallConfig field);
# the option is the field's name (--workers-per-shard), the default the install config's own.
_WORKER_BOUNDS = (("workersPerShard", "workers_per_shard"), ("workersTotal", "workers_total"))


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """--workers-per-shard and --workers-total: a run with other worker bounds (see `worker_experiment`)."""
    for key, name in _WORKER_BOUNDS:
        default = InstallConfig.model_fields[name].default
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            metavar="N",
            help=f"experiment: install config {key} (default {default})",
        )


def worker_experiment(args: argparse.Namespace) -> dict[str, int]:
    """The install config keys the worker options set, for `Stack(config=...)`; announced as an EXPERIMENT
    so that its figures are not taken for the defaults'."""
    experiment = {key: getattr(args, name) for key, name in _WORKER_BOUNDS if getattr(args, name) is not None}
    if experiment:
        defaults = ", ".join(f"{key} {InstallConfig.model_fields[name].default}" for key, name in _WORKER_BOUNDS)
        print(f"EXPERIMENT: {experiment} (defaults: {defaults})")
    return experiment


def least_seconds(cpu: dict[str, float], cores: int, pinned: ShardCpus | None) -> float:
    """The shortest wall time in which this CPU (seconds by component) can run: on all `cores` at once, and,
    pinned, PostgreSQL's on its CPUs and the rest's on theirs. A CPU-bound phase cannot end sooner."""
    total = sum(cpu.values())
    if pinned is None:
        return total / cores
    postgres = cpu.get("postgres", 0.0)
    return max(total / cores, postgres / len(pinned.shard), (total - postgres) / len(pinned.rest))


def add_topology_option(parser: argparse.ArgumentParser) -> None:
    """--shared-cpus: PostgreSQL and the control plane on every CPU (by default the shards get one of their own)."""
    parser.add_argument(
        "--shared-cpus",
        action="store_true",
        help="PostgreSQL (every shard), the apiserver, etcd, the manager and the clients all share every CPU, so the "
        "control plane's CPU is taken from the shards (default: PostgreSQL on the last CPU, everything else on the "
        "others, as shards on hosts of their own; see `ShardCpus`)",
    )


def topology(args: argparse.Namespace) -> ShardCpus | None:
    """The CPUs of the shards apart (`ShardCpus`; None: all share every CPU, by `--shared-cpus` or on a machine
    of one CPU), announced with the machine."""
    shard_cpus = None if args.shared_cpus else ShardCpus.last_cpu()
    if shard_cpus is not None:
        print(f"topology: {shard_cpus.describe()}")
    else:
        why = "--shared-cpus" if args.shared_cpus else "one CPU: the shards cannot have their own"
        print(f"topology: PostgreSQL and the control plane share every CPU ({why})")
    return shard_cpus


# -- output ----------------------------------------------------------------------------------------


def log(message: str) -> None:
    """Progress on stderr (the table and the target lines go to stdout)."""
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def table(title: str, rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> None:
    cells = [[str(c) for c in row] for row in ([header] if header else []) + [list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(max(len(r) for r in cells))]
    print(f"\n== {title}")
    for n, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
        if header and n == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


@dataclass
class Target:
    figure: str  # e.g. "provisioning ratio 1.23x"
    target: str  # e.g. "<= 1.5x"
    passed: bool
    # Its results file: bench/results/<benchmark>.<key>.json, the row `what` names in docs/performance.md.
    key: str = ""
    what: str = ""
    value: float = 0.0
    unit: str = ""  # "x", "%", "s", "MB", ... ("" for a count)

    def line(self) -> str:
        return f"{self.figure}  target {self.target}  {'PASS' if self.passed else 'FAIL'}"


@dataclass(frozen=True)
class ResultsFiles:
    """Where a run's results files go (None: nowhere) and the command line they record."""

    benchmark: str
    command: str
    directory: Path | None

    @classmethod
    def of(cls, module: str, args: argparse.Namespace, argv: Sequence[str] | None = None) -> ResultsFiles:
        words = sys.argv[1:] if argv is None else list(argv)
        command = shlex.join(["python", "-m", module, *words])
        return cls(module.rsplit(".", 1)[-1], command, args.results)

    def write(self, target: Target) -> Path | None:
        """The target's results file, replaced by this run's figure (the git history keeps the earlier ones)."""
        if self.directory is None or not target.key:
            return None
        record = {
            "benchmark": self.benchmark,
            "target": target.key,
            "what": target.what,
            "goal": target.target,
            "figure": float(f"{target.value:.3g}"),
            "unit": target.unit,
            "pass": target.passed,
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
            "commit": tree_commit(),
            "command": self.command,
            "detail": target.figure,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.benchmark}.{target.key}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        return path


def tree_commit() -> str:
    """The checkout's short commit, `+changes` when tracked files outside bench/results differ from it."""

    def git(*words: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *words], capture_output=True, text=True, check=False).stdout

    commit = git("rev-parse", "--short=7", "HEAD").strip() or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return commit + ("+changes" if changed.strip() else "")


def report_targets(targets: Iterable[Target], results: ResultsFiles | None = None) -> None:
    """The target lines on stdout, and each target's results file when `results` says where."""
    print()
    for target in targets:
        print(target.line())
        if results is not None and (path := results.write(target)) is not None:
            log(f"wrote {path}")
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def machine_line() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs ({model}), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def interleaved(variants: Mapping[str, Callable[[], object]], rounds: int, iterations: int) -> dict[str, list[float]]:
    """Time `iterations` calls of each variant per round, alternating the variants (and their order)
    round by round, so both see the same machine. Returns seconds per call, one value per round (what a
    variant returns is dropped)."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for n in range(rounds):
        for name in names if n % 2 == 0 else reversed(names):
            fn = variants[name]
            started = time.perf_counter()
            for _ in range(iterations):
                fn()
            results[name].append((time.perf_counter() - started) / iterations)
    return results


def ratio_of(samples: dict[str, list[float]], numerator: str, denominator: str) -> tuple[float, float]:
    """(ratio of the best rounds, ratio of the median rounds): the best round is the least disturbed."""
    best = min(samples[numerator]) / min(samples[denominator])
    median = statistics.median(samples[numerator]) / statistics.median(samples[denominator])
    return best, median


# -- the stack -------------------------------------------------------------------------------------


BENCH_CONFIG: dict[str, Any] = {
    "releaseName": "dbprovider",
    "namespace": "dbprovider",
    "tls": {"secretName": "dbprovider-tls"},
    "deletionProtection": {"enabled": False},
}


def pin_to_cpus(pid: int, cpus: set[int]) -> None:
    """Run every thread of process `pid` on `cpus` only; the processes and threads it starts later inherit it.
    A process that ended meanwhile (a backend whose session closed) is passed over."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for task in tasks:
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


@dataclass(frozen=True)
class ShardCpus:
    """A shard host of its own on one machine: PostgreSQL runs on `shard`, everything else (the apiserver,
    etcd, the manager, this benchmark and its clients) on `rest`, so the control plane takes no CPU from
    the shard, as in a cluster where the shard's pods and the control plane run on different nodes."""

    shard: set[int]
    rest: set[int]

    @classmethod
    def last_cpu(cls) -> ShardCpus | None:
        """The last CPU for the shards, the others for the rest (None: this process may run on one CPU only)."""
        cpus = os.sched_getaffinity(0)
        if len(cpus) < 2:
            return None
        return cls({max(cpus)}, cpus - {max(cpus)})

    def pin_this_process(self) -> None:
        """Before anything starts: the apiserver, etcd, PostgreSQL and the manager inherit `rest`."""
        pin_to_cpus(os.getpid(), self.rest)

    def pin_postgres(self, *servers: PostgresServer) -> None:
        """Each postmaster and what it started; the backends they start later inherit `shard`."""
        for server in servers:
            for pid in server.process_ids():
                pin_to_cpus(pid, self.shard)

    def describe(self) -> str:
        return (
            f"PostgreSQL on CPU {','.join(map(str, sorted(self.shard)))}, everything else on CPU "
            f"{','.join(map(str, sorted(self.rest)))} (the shards on a host apart from the control plane)"
        )


class Stack:
    """kube-apiserver + etcd, PostgreSQL 18 and the installed product (`DevStack`); `close()` stops all.

    `config` adds install config keys to BENCH_CONFIG (e.g. workersPerShard for an experiment).
    """

    def __init__(
        self,
        name: str,
        *,
        log_statements: bool = False,
        kube_args: list[str] | None = None,
        config: dict[str, Any] | None = None,
        postgres_settings: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_statements = log_statements
        self.kube_args = kube_args
        self.postgres_settings = postgres_settings
        self.config = {**BENCH_CONFIG, **(config or {})}
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"dbprovider-bench-{name}-"))
        self._kube: KubeControlPlane | None = None
        self._postgres: PostgresServer | None = None
        self._dev: DevStack | None = None
        self._clients: list[Any] = []

    def start_dev(self) -> DevStack:
        """Start the apiserver and PostgreSQL and install the product; the installed DevStack, which
        is what a benchmark works with from then on."""
        log("starting kube-apiserver + etcd")
        self._kube = KubeControlPlane(extra_args=self.kube_args).start()
        log("starting PostgreSQL 18" + (" (log_statement=all)" if self.log_statements else ""))
        self._postgres = PostgresServer(
            "18", log_statements=self.log_statements, settings=self.postgres_settings
        ).start()
        log("installing the product (DevStack)")
        self._dev = DevStack(self._kube, self._postgres, self.state_dir / "dev", config_overrides=self.config).install()
        return self._dev

    @property
    def kube(self) -> KubeControlPlane:
        return self._started(self._kube)

    @property
    def postgres(self) -> PostgresServer:
        return self._started(self._postgres)

    @property
    def dev(self) -> DevStack:
        return self._started(self._dev)

    def _started(self, part: T | None) -> T:
        """A part of the stack, which exists once start_dev() has run (instead of an assert at every use)."""
        if part is None:
            raise RuntimeError(f"the {self.name} bench stack is not started")
        return part

    def admin_rest(self, pool: int = 32) -> Rest:
        """A Rest on a new admin client (closed by `close()`)."""
        configuration = self.kube.configuration()
        configuration.connection_pool_maxsize = pool
        import kubernetes.client

        client = kubernetes.client.ApiClient(configuration)
        self._clients.append(client)
        return Rest(client)

    def close(self, *running: Any) -> None:
        """Stop `running` (a benchmark's watches, managers, profilers; None skipped) in order, then the stack."""
        for thing in running:
            if thing is not None:
                thing.stop()
        for client in self._clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
        if self._postgres is not None:
            self._postgres.close()
        if self._kube is not None:
            self._kube.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # -- the apiserver's own request counters ----------------------------------------------------

    def apiserver_metrics(self) -> str:
        configuration = self.kube.configuration()
        cert_file, key_file = configuration.cert_file, configuration.key_file
        assert cert_file is not None and key_file is not None, "the admin configuration has a client certificate"
        response = requests.get(
            f"{self.kube.url}/metrics",
            cert=(cert_file, key_file),
            verify=configuration.ssl_ca_cert,
            timeout=30,
        )
        response.raise_for_status()
        return response.text

    def apiserver_writes(self) -> Counter[str]:
        """apiserver_request_total of the write verbs, by "resource[/subresource] VERB"."""
        return parse_request_totals(self.apiserver_metrics())

    def apiserver_requests(self) -> ApiserverRequests:
        """One scrape of apiserver_request_total."""
        text = self.apiserver_metrics()
        return ApiserverRequests(parse_request_totals(text), parse_request_totals(text, READ_VERBS))


# The apiserver arguments of a `--compacted` run: etcd compacted every 2 minutes instead of every 5. Not
# shorter: a paginated LIST whose later pages come from etcd fails (410, its continue token compacted away)
# and starts over when a compaction passes its resourceVersion, and at 100,000 Databases such a LIST takes
# most of a minute (it never completed with compactions every 10 s).
COMPACTING = ["--etcd-compaction-interval=2m"]


def read_from_etcd(stack: Stack) -> float:
    """Objects the apiserver has read from etcd to answer LISTs, all resources (its own counter)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in stack.apiserver_metrics().splitlines()
        if line.startswith("apiserver_storage_list_fetched_objects_total{")
    )


def wait_until_compacted(stack: Stack, collection: str, timeout: float = 420) -> None:
    """Until a paginated LIST of `collection` (at least 11 objects) reads its later pages from etcd: etcd was
    compacted past the objects' last write and the apiserver's watch cache dropped its snapshots of them, as
    in any cluster where they have not changed for a while (etcd is compacted every 5 minutes by default)."""
    rest = stack.admin_rest()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = read_from_etcd(stack)
        first = rest.get_bytes(collection, query=[("limit", "10")])
        token = first.split(b'"continue":"', 1)[1].split(b'"', 1)[0].decode()
        rest.get_bytes(collection, query=[("limit", "10"), ("continue", token)])
        if read_from_etcd(stack) - before >= 10:
            return
        time.sleep(5)
    raise TimeoutError(f"the apiserver still serves the pages of a LIST from its cache after {timeout:.0f} s")


@dataclass
class ApiserverRequests:
    """apiserver_request_total by "resource[/subresource] VERB", the writes apart from the reads."""

    writes: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)

    def since(self, before: ApiserverRequests) -> ApiserverRequests:
        """The requests made after `before` (an earlier scrape) until this one."""
        return ApiserverRequests(counter_delta(self.writes, before.writes), counter_delta(self.reads, before.reads))


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_request_totals(text: str, verbs: frozenset[str] = WRITE_VERBS) -> Counter[str]:
    totals: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group("labels")))
        if labels.get("verb") not in verbs:
            continue
        resource = labels.get("resource", "?")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        totals[f"{resource} {labels['verb']}"] += int(float(match.group("value")))
    return totals


def counter_delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})


# -- the statements the shards received ----------------------------------------------------------


class BlindStatementLog(RuntimeError):
    """The statement log shows no statement where some must exist: every count from it would be 0."""


class ProvisionerStatements:
    """What the provisioner sends to one or more servers from now on, read with the one reader of tests
    and benchmarks (harness.statement_log, the servers' jsonlog). The servers need log_statement=all."""

    def __init__(self, *servers: PostgresServer, user: str = PostgresServer.PROVISIONER) -> None:
        self.user = user
        self.logs = [StatementLog(server) for server in servers]

    def statements(self) -> list[LoggedStatement]:
        return [s for log in self.logs for s in log.statements(self.user)]

    def keywords(self, detail: bool = False) -> Counter[str]:
        """By first keyword (SELECT, CREATE...), or with `detail` by their first 72 characters."""
        return keywords(self.statements(), detail)

    def expect(self, what: str, detail: bool = False) -> Counter[str]:
        """`keywords`, refusing loudly when there is none although `what` must have sent some."""
        found = self.keywords(detail)
        if not found:
            raise BlindStatementLog(
                f"the statement log shows no {self.user} statement at all, but {what} must have sent some: "
                "a count from it would read 0 (is log_statement=all set, and the reader reading the right log?)"
            )
        return found


def bench_owner() -> OwnerRecord:
    """The ownership record a baseline tenant gets, as the controller writes one for each Database."""
    return OwnerRecord("bench-consumer", str(uuid.uuid4()))


@dataclass
class Timed:
    """What a timed phase took: wall seconds, CPU seconds by component (a CpuMeter's) and the
    seconds the whole machine was busy (every tenant of it)."""

    seconds: float
    cpu: dict[str, float]
    machine_cpu: float


def run_on_sessions(
    jobs: Sequence[tuple[AdminSession, queue.Queue[TenantSpec]]],
    work: Callable[[AdminSession, TenantSpec], None],
    label: str,
    meter: CpuMeter,
) -> Timed:
    """A baseline's SQL: each admin session takes tenants from its queue (sessions may share one) and
    runs `work` on each, every session released at once; raises if any tenant failed. The sessions
    connect before the clock starts (as the controller's are connected), the CPU is read before they
    close (a backend's CPU leaves with it), and they are closed afterwards. The seconds run from the
    release until the last session is done."""
    admins = list(dict.fromkeys(admin for admin, _ in jobs))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda admin: admin.connection(), admins))
    try:
        spent = CpuSpent(meter)
        elapsed = _released_on_sessions(jobs, work, label)
        cpu, busy = spent.read()
    finally:
        for admin in admins:
            admin.close()
    return Timed(elapsed, cpu, busy)


def _released_on_sessions(
    jobs: Sequence[tuple[AdminSession, queue.Queue[TenantSpec]]],
    work: Callable[[AdminSession, TenantSpec], None],
    label: str,
) -> float:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs) + 1)

    def worker(admin: AdminSession, tenants: queue.Queue[TenantSpec]) -> None:
        barrier.wait()
        while True:
            try:
                spec = tenants.get_nowait()
            except queue.Empty:
                return
            try:
                work(admin, spec)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    started = _run_released_at_once([threading.Thread(target=worker, args=job) for job in jobs], barrier)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"baseline {label}: {len(errors)} failures, first: {errors[0]!r}")
    return elapsed


def log_in_as_tenant(server: PostgresServer, spec: TenantSpec, timeout: float = 10.0) -> None:
    """What the product does before a new database is Ready, for a baseline: a login as the tenant on
    a fresh TLS session at the server itself (the Shard's client endpoint in the benchmarks)."""
    log_in(
        TenantLogin("127.0.0.1", server.port, spec.name, spec.password, sslmode="require", dbname=spec.name),
        timeout,
        "bench",
    )


def drop_all_tenants(server: PostgresServer) -> int:
    """Drop every database and role but the server's own (not timed: frees a throwaway server's disk
    between phases); returns how many databases went."""
    with server.superuser_connection() as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')"
            )
        ]
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        roles = [
            row[0]
            for row in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname NOT LIKE 'pg\\_%%' AND rolname NOT IN (%s, %s)",
                (PostgresServer.SUPERUSER, PostgresServer.PROVISIONER),
            )
        ]
        for role in roles:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    return len(names)


def shards_ready(rest: Rest, names: Iterable[str]) -> bool:
    """Every one of the Shards `names` is Ready (its checks pass: the provider can work on it)."""
    for name in names:
        conditions = (rest.get(SHARDS, name).get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return False
    return True


class ReadyWatch:
    """Records when each Database (by externalId) is first seen Ready, and its shard, through a real watch."""

    def __init__(self, stack: Stack, namespace: str) -> None:
        self.ready_at: dict[str, float] = {}
        self.shard_of: dict[str, str] = {}
        self.lock = threading.Lock()
        self.informer = Informer(stack.admin_rest(4), DATABASES, namespace)
        self.informer.add_handler(self._on_event)

    def _on_event(self, event_type: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        status = new.get("status") or {}
        external_id = (new.get("spec") or {}).get("externalId")
        if not isinstance(external_id, str):  # not a Database the API could have created: nobody waits for it
            return
        now = time.perf_counter()
        with self.lock:
            if status.get("shard"):
                self.shard_of.setdefault(external_id, status["shard"])
            if status.get("phase") == "Ready":
                self.ready_at.setdefault(external_id, now)

    def start(self) -> ReadyWatch:
        self.informer.start()
        self.informer.wait_for_sync(60)
        return self

    def count(self, ids: set[str]) -> int:
        with self.lock:
            return sum(1 for i in ids if i in self.ready_at)

    def stop(self) -> None:
        self.informer.stop()


# -- bursts of PUTs ------------------------------------------------------------------------------


def put_all(
    manager: ManagerProcess, tokens: list[str], ids: list[str], clients: int
) -> tuple[float, float, Counter[str], dict[str, float]]:
    """PUT every id from `clients` TLS clients released at once, the ids dealt out over the consumers
    (`tokens`), each client working for one consumer on one keep-alive connection (with as many
    clients as ids: one connection per PUT). Connection errors and 5xx answers are retried and
    counted. Returns (the release time, all answered after, answers, id -> its first send time)."""
    answers: Counter[str] = Counter()
    sent: dict[str, float] = {}
    lock = threading.Lock()
    work: list[queue.Queue[str]] = [queue.Queue() for _ in tokens]
    for n, external_id in enumerate(ids):
        work[n % len(tokens)].put(external_id)
    barrier = threading.Barrier(clients + 1)
    ca = str(manager.dev.ca_file)
    one_each = clients >= len(ids)  # a client done early must not take a second id on its warm connection

    def client(n: int) -> None:
        session = requests.Session()  # verify per request: REQUESTS_CA_BUNDLE would override session.verify
        headers = {"Authorization": f"Bearer {tokens[n % len(tokens)]}"}
        mine = work[n % len(tokens)]
        barrier.wait()
        while True:
            try:
                external_id = mine.get_nowait()
            except queue.Empty:
                break
            with lock:
                sent[external_id] = time.perf_counter()
            for attempt in range(60):
                try:
                    response = session.put(
                        manager.url(f"/v1/databases/{external_id}"),
                        json={"sizeClass": "small"},
                        headers=headers,
                        verify=ca,
                        timeout=60,
                    )
                except requests.RequestException as exc:
                    with lock:
                        answers[f"client error {type(exc).__name__}: {str(exc)[:100]}"] += 1
                    time.sleep(0.05 * (attempt + 1))
                    continue
                with lock:
                    answers[f"HTTP {response.status_code}"] += 1
                    if response.status_code not in (200, 201):  # which error (the body has no secret)
                        answers[f"HTTP {response.status_code}: {response.text[:120]}"] += 1
                if response.status_code < 500:
                    break
                time.sleep(0.05 * (attempt + 1))
            if one_each:
                break
        session.close()

    started = _run_released_at_once([threading.Thread(target=client, args=(n,)) for n in range(clients)], barrier)
    return started, time.perf_counter() - started, answers, sent


def _run_released_at_once(threads: list[threading.Thread], barrier: threading.Barrier) -> float:
    """Start `threads` (each waits on `barrier` first), release them together, wait for all of them;
    returns the release time (perf_counter)."""
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return started


# -- a `dbprovider manager` process ----------------------------------------------------------------


class ManagerProcess(ManagerEndpoints):
    """`dbprovider manager` for a DevStack, as a child process that dies with the benchmark."""

    def __init__(
        self,
        stack: Stack,
        name: str = "bench-manager",
        python: str = sys.executable,
        checkout: Path = REPO,
    ) -> None:
        """`checkout`: the source tree the manager runs from (another release's, to compare starts)."""
        super().__init__()
        self.stack = stack
        self.dev = stack.dev
        self.name = name
        self.log_file = stack.state_dir / f"{name}.log"
        env = {**os.environ, **self.dev.manager_env(), "POD_NAME": name, "PYTHONPATH": str(checkout)}
        argv = self.dev.manager_argv(python, self.api_port, self.metrics_port)
        argv.insert(1, "-P")  # not the working directory first: the code is `checkout`'s (PYTHONPATH)
        self.started = time.monotonic()
        self.proc: subprocess.Popen[bytes] = spawn(argv, self.log_file, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def reconciles(self, controller: str = "database") -> float:
        """`controller`'s reconciles so far (dbprovider_reconciles_total), for deltas."""
        return metric_sum(self.metrics(), "dbprovider_reconciles_total", controller=controller)

    def ready(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"manager exited with {self.proc.returncode}: {self.tail()}")
        try:
            return requests.get(self.url("/readyz"), verify=str(self.dev.ca_file), timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def leading(self, rest: Rest) -> bool:
        try:
            lease = rest.get(LEASES, f"{self.dev.config.release_name}-manager", self.dev.namespace)
        except Exception:  # noqa: BLE001 - not there yet
            return False
        return (lease.get("spec") or {}).get("holderIdentity") == self.name

    def wait_leading(self, rest: Rest, timeout: float = 120) -> None:
        wait_for(self.ready, timeout, "manager /readyz", 0.2)
        wait_for(lambda: self.leading(rest), timeout, "manager to hold the Lease", 0.2)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGTERM, timeout=40)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(_LABEL.findall(head))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


# -- profiles --------------------------------------------------------------------------------------


@dataclass
class PySpy:
    """`py-spy record` attached to a running process (every thread), as collapsed stacks.

    `idle=True` samples blocked threads too (where time goes); `idle=False` only threads on the CPU
    (where CPU goes)."""

    pid: int
    out: Path
    rate: int = 50
    idle: bool = True
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> PySpy:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--rate",
                str(self.rate),
                "--nonblocking",
                "--threads",
                *(["--idle"] if self.idle else []),
                "-o",
                str(self.out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        time.sleep(1.0)  # attach before the measured window
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
OUR_PACKAGES = ("api/", "reconciler/", "informers/", "domain/", "dbprovider/", "bench/")
# What a sampled stack is doing: blocked waiting for work (innermost frame), else the first of these
# markers found from the innermost frame outwards, else Python code running on the CPU.
WAITING_FILES = ("threading.py", "selectors.py", "queue.py", "socketserver.py")
ACTIVITIES = (
    ("SQL (psycopg)", ("psycopg/", "reconciler/sql/")),
    ("apiserver request", ("informers/rest.py", "kubernetes/client/", "urllib3/")),
)


def _parse_collapsed(path: Path) -> list[tuple[str, list[tuple[str, str]], int]]:
    samples = []
    for raw in path.read_text(errors="replace").splitlines():
        stack, _, count_text = raw.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        thread = "?"
        frames: list[tuple[str, str]] = []
        for frame in stack.split(";"):
            if frame.startswith("thread (") or frame.startswith("process "):
                thread = frame.split(": ", 1)[1] if ": " in frame else frame
                continue
            match = _FRAME.match(frame)
            if match:
                frames.append((match.group("func"), match.group("file") or ""))
            else:
                frames.append((frame, ""))
        group = "unnamed threads" if thread.startswith("thread (") else re.sub(r"-\d+$", "-N", thread)
        samples.append((group, frames, int(count_text)))
    return samples


def _activity(frames: list[tuple[str, str]]) -> str:
    if any(func == "WatchStream.lines" for func, _ in frames):
        return "waiting for work"  # an informer's open watch: blocked until the apiserver sends an event
    if frames and frames[-1][1].startswith(WAITING_FILES):
        return "waiting for work"  # a lock, condition, queue or select: blocked
    if frames and frames[-1] == ("_worker", "concurrent/futures/thread.py"):
        return "waiting for work"  # an idle pool thread: blocked in SimpleQueue.get, which is C (no frame)
    for _, file in reversed(frames):
        for name, markers in ACTIVITIES:
            if file.startswith(markers):
                return name
    return "CPU (Python)"


def summarize_collapsed(path: Path, top: int = 15) -> str:
    """A py-spy `--idle --threads` raw profile: what each thread group spends its time on, the top
    functions by self time among busy samples, and the project functions the busy time is under."""
    if not path.exists():
        return f"(no profile at {path})"
    samples = _parse_collapsed(path)
    if not samples:
        return "(empty profile)"
    per_thread: dict[str, Counter[str]] = {}
    self_busy: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy_total = 0
    for thread, frames, count in samples:
        activity = _activity(frames)
        per_thread.setdefault(thread, Counter())[activity] += count
        if activity == "waiting for work" or not frames:
            continue
        busy_total += count
        func, file = frames[-1]
        self_busy[f"{func} ({file})"] += count
        seen = set()
        for func, file in frames:
            if file.startswith(OUR_PACKAGES) and (func, file) not in seen:
                seen.add((func, file))
                inclusive[f"{func} ({file})"] += count
    lines = ["time by thread group (samples; share of that group's samples):"]
    for thread, activities in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(activities.values())
        parts = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in activities.most_common())
        lines.append(f"  {thread:32s} {total:6d}  {parts}")
    lines.append(f"top self time of busy samples ({busy_total} samples, not waiting for work):")
    for name, count in self_busy.most_common(top):
        lines.append(f"  {100 * count / busy_total:5.1f}%  {name}")
    lines.append("busy samples under project functions (inclusive):")
    for name, count in inclusive.most_common(top):
        lines.append(f"  {100 * count / busy_total:5.1f}%  {name}")
    return "\n".join(lines)


def pyinstrument_profile() -> Profiler | None:
    """A started pyinstrument Profiler, or None when pyinstrument is not installed (bench extra)."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        log("pyinstrument is not installed (pip install -e '.[bench]'): no in-process profile")
        return None
    profiler = Profiler(interval=0.001)
    profiler.start()
    return profiler


def pyinstrument_text(profiler: Profiler | None, path: Path | None = None) -> str:
    if profiler is None:
        return "(pyinstrument not installed)"
    profiler.stop()
    text: str = profiler.output_text(unicode=False, color=False, show_all=False)
    if path is not None:
        path.write_text(text)
    return text


# -- CPU per component -----------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds (user + system) used by each component this benchmark started, between snapshots.

    Components are found among this process' descendants by name: kube-apiserver, etcd, postgres
    (the postmaster and its backends), the manager (by pid), `extra` ones by pid (name -> pid), and
    this benchmark process itself. Backends that exit between two snapshots are missed, so
    PostgreSQL's figure is a lower bound.
    """

    def __init__(self, manager_pid: int | None = None, extra: dict[str, int] | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.manager_pid = manager_pid
        self.extra = {pid: name for name, pid in (extra or {}).items()}

    def _component(self, proc: Any) -> str | None:
        try:
            if proc.pid == self.manager_pid:
                return "manager"
            if proc.pid in self.extra:
                return self.extra[proc.pid]
            name = proc.name()
        except self._psutil.Error:
            return None
        if name.startswith("kube-apiserver"):
            return "kube-apiserver"
        if name == "etcd":
            return "etcd"
        if name == "postgres":
            return "postgres"
        return None

    def snapshot(self) -> dict[str, float]:
        me = self._psutil.Process()
        totals: dict[str, float] = {"benchmark process": sum(me.cpu_times()[:2])}
        for proc in me.children(recursive=True):
            component = self._component(proc)
            if component is None:
                continue
            try:
                times = proc.cpu_times()
            except self._psutil.Error:
                continue
            totals[component] = totals.get(component, 0.0) + times.user + times.system
        return totals

    @staticmethod
    def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before.get(k, 0.0) for k in after}


class CpuSpent:
    """CPU seconds by component (of `meter`) and seconds the whole machine was busy, from its
    creation to each `read()`."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self._cpu, self._busy = meter.snapshot(), machine_busy()

    def read(self) -> tuple[dict[str, float], float]:
        return self.meter.delta(self.meter.snapshot(), self._cpu), machine_busy() - self._busy


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all processes, every tenant), for deltas."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)
