"""Scale: a `dbprovider manager` starting on 10,000 Ready Databases on 20 shards.

    python -m bench.scale [--count 10000] [--shards 20] [--idle-seconds 60] [--profile]

Setup (not timed): 20 Shards sharing one PostgreSQL 18 server (log_statement=all), and `--count`
Database objects created directly through the apiserver, spread over the shards, each with the
finalizer, status Ready written through the status subresource exactly as the controller writes it,
and its owned credentials Secret (`build_secret`), so the manager finds Ready databases with
consistent Secrets and has nothing to do but look at them.

Measured on the manager process: start to caught-up (/readyz, holding the Lease, every Database
counted by `dbprovider_databases`, and then the process idle: under 5% of a core for 2 s; the time
reported is when that quiet window began), RSS (psutil; peak and after the idle minute), the
provisioner's statements on the server from the manager's start to the end of the idle minute
(changes must be zero; the Shard pings' catalog reads are reported separately), and idle CPU over
`--idle-seconds` (cpu_times delta). With `--profile` a second manager is then started on the same
objects with py-spy attached, and its start is profiled (the first, measured start is not).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    ManagerProcess,
    ProvisionerStatements,
    PySpy,
    Stack,
    Target,
    counter_delta,
    log,
    machine_line,
    metric_sum,
    report_targets,
    shards_ready,
    summarize_collapsed,
    table,
    wait_for,
)
from domain.constants import (
    API_VERSION,
    FINALIZER_TENANT,
    KIND_DATABASE,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
    DatabaseConditionType,
    DatabaseReason,
    Phase,
)
from domain.credentials import Endpoint, build_secret, new_password, password_id
from domain.naming import database_object_name, label_value, tenant_name
from informers import SECRETS, Rest
from reconciler.resources import DATABASES, SHARDS

RSS_LIMIT_MB = 400
CAUGHT_UP_LIMIT_S = 60
IDLE_CPU_LIMIT = 2.0  # percent of one core
QUIET_CPU = 5.0  # percent of one core: "idle" for the caught-up detection
QUIET_WINDOW = 2.0
CHANGES = ("ALTER", "CREATE", "GRANT", "REVOKE", "DROP", "SET", "RESET", "COMMENT")


def create_shards(rest: Rest, stack: Stack, count: int, per_shard: int) -> list[str]:
    """`count` Shards on the stack's one server, sharing the DevStack shard's admin Secret."""
    dev, pg = stack.dev, stack.postgres
    assert dev is not None and pg is not None
    names = [f"scale-{i:02d}" for i in range(count)]
    for name in names:
        rest.create(SHARDS, {
            "apiVersion": API_VERSION,
            "kind": "Shard",
            "metadata": {"name": name},
            "spec": {
                "maxDatabases": per_shard + 100,
                "perconaCluster": {"namespace": dev.namespace, "name": name},
                "admin": {
                    "serviceName": f"{name}-primary",
                    "port": pg.port,
                    "sslmode": "require",
                    "secretRef": {"namespace": dev.shard_secrets_namespace, "name": dev.admin_secret},
                },
                "client": {"host": "127.0.0.1", "port": pg.port, "sslmode": "require"},
            },
        })
    rest.delete(SHARDS, dev.shard)  # exactly `count` shards (the DevStack's one holds no database)
    return names


def ready_status(shard: str, tenant: str, now: str) -> dict[str, Any]:
    """The status the Database controller writes for a provisioned database (small: limit 5)."""
    return {
        "shard": shard,
        "tenantName": tenant,
        "phase": Phase.READY.value,
        "appliedSizeClass": "small",
        "appliedConnectionLimit": 5,
        "observedGeneration": 1,
        "conditions": [{
            "type": DatabaseConditionType.READY.value,
            "status": "True",
            "reason": DatabaseReason.PROVISIONED.value,
            "message": "tenant exists on the shard",
            "lastTransitionTime": now,
            "observedGeneration": 1,
        }],
    }


def create_databases(rest: Rest, stack: Stack, shards: list[str], count: int, threads: int) -> float:
    """`count` Ready Databases with their Secrets, round-robin over `shards`; returns the seconds taken."""
    dev, pg = stack.dev, stack.postgres
    assert dev is not None and pg is not None
    consumer, namespace = dev.consumer, dev.namespace
    endpoint = Endpoint("127.0.0.1", pg.port, "require")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = Counter[str]()
    lock = threading.Lock()
    started = time.monotonic()

    def one(i: int) -> None:
        external_id = f"db-{i:05d}"
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND_DATABASE,
            "metadata": {
                "name": database_object_name(consumer, external_id),
                "namespace": namespace,
                "labels": {LABEL_CONSUMER: label_value(consumer), LABEL_EXTERNAL_ID: label_value(external_id)},
                "finalizers": [FINALIZER_TENANT],
            },
            "spec": {"consumer": consumer, "externalId": external_id, "sizeClass": "small", "engine": "postgres"},
        }
        db = rest.create(DATABASES, body, namespace)
        tenant = tenant_name(external_id, db["metadata"]["uid"])
        secret = build_secret(db, tenant, new_password(), endpoint)
        status = {**ready_status(shards[i % len(shards)], tenant, now), "passwordApplied": password_id(secret)}
        rest.patch(DATABASES, db["metadata"]["name"], {"status": status}, namespace, subresource="status")
        rest.create(SECRETS, secret, namespace)
        with lock:
            done["n"] += 1
            if done["n"] % 1000 == 0:
                elapsed = time.monotonic() - started
                log(f"  {done['n']} databases ({done['n'] / elapsed:.0f}/s)")

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(one, i) for i in range(count)]:
            future.result()
    return time.monotonic() - started


class Sampler:
    """Polls the manager process: CPU (cpu_times), RSS, and its own readiness as we define it."""

    def __init__(self, manager: ManagerProcess) -> None:
        self.manager = manager
        self.proc = psutil.Process(manager.pid)
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, cpu seconds, rss bytes)

    def sample(self) -> tuple[float, float, float]:
        times = self.proc.cpu_times()
        value = (time.monotonic(), times.user + times.system, float(self.proc.memory_info().rss))
        self.samples.append(value)
        return value

    def cpu_at(self, since_start: float) -> float:
        """CPU seconds used by the first sample at least `since_start` s after the process started."""
        for t, cpu, _ in self.samples:
            if t - self.manager.started >= since_start:
                return cpu
        return self.samples[-1][1]

    @property
    def peak_rss(self) -> float:
        return max(s[2] for s in self.samples)

    def quiet_since(self) -> float | None:
        """The start of the trailing window of QUIET_WINDOW s with CPU under QUIET_CPU %, if any."""
        if len(self.samples) < 2:
            return None
        end_t, end_cpu, _ = self.samples[-1]
        for t, cpu, _ in reversed(self.samples[:-1]):
            if end_t - t >= QUIET_WINDOW:
                return t if 100 * (end_cpu - cpu) / (end_t - t) < QUIET_CPU else None
        return None


def wait_caught_up(
    manager: ManagerProcess, rest: Rest, count: int, timeout: float = 600
) -> tuple[Sampler, dict[str, float]]:
    """Poll until caught up; returns the sampler and milestones (seconds since the process started)."""
    sampler = Sampler(manager)
    milestones: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now, _, _ = sampler.sample()
        since = now - manager.started
        if "ready" not in milestones and manager.ready():
            milestones["/readyz 200 (caches synced)"] = milestones["ready"] = since
        if "ready" in milestones and "leading" not in milestones and manager.leading(rest):
            milestones["holds the Lease (controllers started)"] = milestones["leading"] = since
        if "leading" in milestones and "counted" not in milestones:
            try:
                counted = metric_sum(manager.metrics(), "dbprovider_databases", phase="Ready")
            except Exception:  # noqa: BLE001 - not serving yet
                counted = 0
            if counted >= count:
                milestones[f"dbprovider_databases counts {count} Ready"] = milestones["counted"] = since
        if "counted" in milestones:
            quiet = sampler.quiet_since()
            if quiet is not None and quiet - manager.started >= milestones["leading"]:
                milestones["caught up (idle from)"] = milestones["caught_up"] = quiet - manager.started
                return sampler, milestones
        time.sleep(0.25)
    raise TimeoutError(f"manager not caught up within {timeout:.0f}s: {milestones}\n{manager.tail()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000, help="Database objects (default 10,000)")
    parser.add_argument("--shards", type=int, default=20, help="Shards sharing the one server (default 20)")
    parser.add_argument("--threads", type=int, default=16, help="threads creating the objects (default 16)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window (default 60)")
    parser.add_argument("--profile", action="store_true",
                        help="then start a second manager with py-spy attached and profile its start")
    parser.add_argument("--profile-dir", type=Path, default=Path("bench/profiles"))
    args = parser.parse_args(argv)
    count = args.count

    print(f"scale: {count} Ready Databases on {args.shards} shards (one PostgreSQL 18 server)")
    print(f"machine: {machine_line()}")
    # A larger watch cache and request budget keep 30,000 creates from being throttled by the apiserver.
    stack = Stack("scale", log_statements=True, kube_args=["--max-requests-inflight=800",
                                                           "--max-mutating-requests-inflight=400"])
    manager: ManagerProcess | None = None
    spy: PySpy | None = None
    try:
        stack.start()
        assert stack.dev is not None and stack.postgres is not None
        rest = stack.admin_rest(args.threads + 8)
        shards = create_shards(rest, stack, args.shards, -(-count // args.shards))
        log(f"creating {count} Databases (+ status, + Secret) with {args.threads} threads")
        setup_seconds = create_databases(rest, stack, shards, count, args.threads)
        log(f"created in {setup_seconds:.0f} s")

        statements = ProvisionerStatements(stack.postgres)
        writes_before = stack.apiserver_writes()
        manager = ManagerProcess(stack, "scale-manager")
        sampler, milestones = wait_caught_up(manager, rest, count)
        caught_up = milestones["caught_up"]
        rss_caught_up = sampler.samples[-1][2]
        writes_start = counter_delta(stack.apiserver_writes(), writes_before)
        # Only then is "no SQL for Ready databases" evidence: a database of a shard that is not Ready
        # waits without SQL whatever the controller would do (the Shards' admin Secret was once wrong
        # here, and every count read 0).
        wait_for(lambda: shards_ready(rest, shards), 120, f"all {args.shards} Shards Ready", 0.5)
        log(f"caught up after {caught_up:.1f} s, every Shard Ready; idle window of {args.idle_seconds:.0f} s")

        idle_before = sampler.sample()
        writes_idle_before = stack.apiserver_writes()
        time.sleep(args.idle_seconds)
        idle_after = sampler.sample()
        writes_idle = counter_delta(stack.apiserver_writes(), writes_idle_before)
        idle_cpu = 100 * (idle_after[1] - idle_before[1]) / (idle_after[0] - idle_before[0])
        rss_end = idle_after[2]
        found = statements.expect(f"the Shard checks of {args.shards} shards over the idle window")
        changes = sum(n for k, n in found.items() if k in CHANGES)
        manager.stop()
        manager = None

        table("manager start", [(k, f"{v:.1f} s") for k, v in milestones.items()
                                if k not in ("ready", "leading", "counted", "caught_up")],
              ("milestone", "since the process started"))
        table("resources", [
            ("RSS when caught up", f"{rss_caught_up / 2**20:.0f} MB"),
            ("RSS peak (sampled every 0.25 s)", f"{sampler.peak_rss / 2**20:.0f} MB"),
            (f"RSS after the idle {args.idle_seconds:.0f} s", f"{rss_end / 2**20:.0f} MB"),
            ("CPU from start to caught up", f"{sampler.cpu_at(caught_up):.1f} CPU-s"),
            (f"idle CPU over {idle_after[0] - idle_before[0]:.0f} s", f"{idle_cpu:.2f}% of one core"),
        ], ("what", "value"))
        table("apiserver writes by the start (until caught up)",
              [(k, v) for k, v in writes_start.most_common()] or [("none", 0)], ("resource verb", "requests"))
        table(f"apiserver writes in the idle {args.idle_seconds:.0f} s",
              [(k, v) for k, v in writes_idle.most_common()] or [("none", 0)], ("resource verb", "requests"))
        table("provisioner statements on the server, manager start to the end of the idle window",
              [(k, n, "change" if k in CHANGES else "catalog read (Shard pings)") for k, n in found.most_common()]
              or [("none", 0, "")], ("keyword", "count", "kind"))

        if args.profile:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            log("profiling a second start with py-spy")
            manager = ManagerProcess(stack, "scale-manager-profiled")
            spy = PySpy(manager.pid, args.profile_dir / "scale-start.pyspy.txt", rate=50)
            spy.start()
            _, profiled = wait_caught_up(manager, rest, count)
            spy.stop()
            print(f"\n== py-spy, second manager start (caught up after {profiled['caught_up']:.1f} s "
                  "with the profiler attached; not the measured start)")
            print(summarize_collapsed(spy.out))
            manager.stop()
            manager = None

        print(f"\nsetup: {count} Databases + status + Secrets created in {setup_seconds:.0f} s "
              f"({3 * count / setup_seconds:.0f} writes/s)")
        report_targets([
            Target(f"manager RSS peak {sampler.peak_rss / 2**20:.0f} MB", f"< {RSS_LIMIT_MB} MB",
                   sampler.peak_rss / 2**20 < RSS_LIMIT_MB),
            Target(f"start to caught up {caught_up:.1f} s", f"< {CAUGHT_UP_LIMIT_S} s", caught_up < CAUGHT_UP_LIMIT_S),
            Target(f"SQL changes for Ready databases {changes} (catalog reads {found.get('SELECT', 0)})", "== 0",
                   changes == 0),
            Target(f"idle CPU {idle_cpu:.2f}% of one core", f"< {IDLE_CPU_LIMIT}%", idle_cpu < IDLE_CPU_LIMIT),
        ])
    finally:
        stack.close(spy, manager)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
