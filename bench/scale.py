"""Scale: a `dbprovider manager` starting on a fleet of Ready Databases, Shards and Consumers.

    python -m bench.scale [--count 10000] [--shards 20] [--consumers 1] [--extra-consumers 100]
                          [--idle-seconds 60] [--profile] [--profile-idle 60]
    python -m bench.scale --count 100000 --shards 200 --consumers 1000 --compacted   # docs/performance.md
    python -m bench.scale --count 20000 --shards 200 --consumers 1000 --runs 0 --baseline /tmp/base [--profile]
    python -m bench.scale --count 2000 --shards 200 --consumers 1000 --runs 0 --baseline /tmp/base --rounds 2 \
        --compare-idle 120                                             # idle CPU, two trees on one fleet

Setup (not timed, but reported): `--shards` Shards sharing one PostgreSQL 18 server
(log_statement=all), `--consumers` Consumers each with its token Secret (as `dbprovider consumer new`
writes them: no label), and `--count` Database objects created directly through the apiserver, spread
over the shards and the consumers, each with the finalizer, status Ready written through the status
subresource exactly as the controller writes it, and its owned credentials Secret (`build_secret`),
so the manager finds Ready databases with consistent Secrets and has nothing to do but look at them.

Measured on the manager process (the production auth path: its own TokenIndex on its own caches):
start to caught-up (/readyz, holding the Lease, every Database counted by `dbprovider_databases`,
and then the process idle: under 5% of a core for 2 s; the time reported is when that quiet window
began), the first authenticated answer (a GET with a consumer's token, polled from the start), RSS
(psutil; peak and after the idle window), the watches the apiserver holds open for it (its
`apiserver_longrunning_requests` and `apiserver_registered_watchers` gauges before and after),
the same after `--extra-consumers` more Consumers, how long a token Secret change takes to apply,
the provisioner's statements on the server from the manager's start to the end of the idle window
(harness/statement_log.py; changes must be zero, the Shard pings' catalog reads show the log is
read), and idle CPU over `--idle-seconds` (cpu_times delta) with the manager's wake-ups in that window
(voluntary context switches). With `--profile-idle S` py-spy then samples the idle manager for S more
seconds, on-CPU samples only (where the idle CPU goes; not part of the measured window). With
`--profile` a second manager is then started on the same objects with py-spy attached, and its start
is profiled.

`--baseline DIR` compares two trees on one fleet (creating 100,000 objects takes half an hour; a fleet is
made once per run): DIR is another checkout (`git archive main | tar -x -C DIR`) run with this venv. After
one warm-up start (the first start after the setup writes the Consumer counts and Shard conditions), each
of `--rounds` rounds starts the baseline's manager and then this tree's, each measured to caught up:
caches synced (/readyz), Lease held, the first pass done (`dbprovider_reconciles_total` of the Database
controller reaching the count, polled each second), caught up, CPU and peak RSS; a table gives every
run and the median ratio. With `--profile`, one further start of each is profiled with py-spy. With
`--compare-idle S` each of those starts is then also measured idle: once every Shard is Ready and 20 s
more have passed, its CPU over S seconds and the Shard reconciles in them (the checks: CPU per check).

`--lock PATH` takes the machine's benchmark lock (flock) exclusive for the measured part and shared for the
setup: the setup of a large fleet (half an hour at 100,000) may run beside another setup, not beside a
measurement (a `flock` from the shell or another benchmark's measured part), whose figures its load would skew.
`--start-after PATH` waits after the setup until PATH exists: the managers start from the tree as it is then.
`--warmup` makes one unmeasured start before `--runs` without a baseline (the first start after a setup writes
the Consumer counts and Shard conditions).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.common import (
    COMPACTING,
    REPO,
    ManagerProcess,
    ProvisionerStatements,
    PySpy,
    ResultsFiles,
    Stack,
    Target,
    bench_parser,
    counter_delta,
    log,
    machine_line,
    machine_lock,
    metric_sum,
    report_targets,
    shards_ready,
    summarize_collapsed,
    table,
    wait_for,
    wait_until_compacted,
)
from domain.constants import (
    API_VERSION,
    FINALIZER_TENANT,
    KIND_DATABASE,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
    DatabaseConditionType,
    DatabaseReason,
    OwnershipReason,
    Phase,
)
from domain.credentials import Endpoint, build_secret, new_password, password_id
from domain.naming import database_object_name, label_value, tenant_name
from domain.resources import DATABASES, SHARDS
from domain.tokens import hash_token
from harness.background import Background
from informers import SECRETS, Rest

RSS_LIMIT_MIB = 512  # the Deployment's default memory limit (resources.manager.limits.memory)
CAUGHT_UP_LIMIT_S = 30
IDLE_CPU_LIMIT = 2.0  # percent of one core
TOKEN_CHANGE_LIMIT_S = 1.0  # docs/api.md: "Changes take effect within about a second"
QUIET_CPU = 5.0  # percent of one core: "idle" for the caught-up detection
QUIET_WINDOW = 2.0
HIDDEN_MILESTONES = ("ready", "leading", "counted", "passed", "caught_up")
CHANGES = ("ALTER", "CREATE", "GRANT", "REVOKE", "DROP", "SET", "RESET", "COMMENT")


def create_shards(rest: Rest, stack: Stack, count: int, per_shard: int) -> list[str]:
    """`count` Shards on the stack's one server, sharing the DevStack shard's admin Secret (listed in
    shardSecrets, in a namespace of its own, as docs/install.md asks)."""
    dev, pg = stack.dev, stack.postgres
    names = [f"scale-{i:02d}" for i in range(count)]
    for name in names:
        rest.create(
            SHARDS,
            {
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
            },
        )
    rest.delete(SHARDS, dev.shard)  # exactly `count` shards (the DevStack's one holds no database)
    return names


def ready_status(shard: str, tenant: str, now: str) -> dict[str, Any]:
    """The status the Database controller writes for a provisioned database (small: limit 5), its
    ownership record confirmed at creation (else each start would check every tenant on its shard once)."""
    return {
        "shard": shard,
        "tenantName": tenant,
        "phase": Phase.READY.value,
        "appliedSizeClass": "small",
        "appliedConnectionLimit": 5,
        "observedGeneration": 1,
        "conditions": [
            {
                "type": DatabaseConditionType.READY.value,
                "status": "True",
                "reason": DatabaseReason.PROVISIONED.value,
                "message": "tenant exists on the shard",
                "lastTransitionTime": now,
                "observedGeneration": 1,
            },
            {
                "type": DatabaseConditionType.OWNERSHIP_RECORDED.value,
                "status": "True",
                "reason": OwnershipReason.RECORDED.value,
                "message": "the tenant role's ownership record names this Database",
                "lastTransitionTime": now,
                "observedGeneration": 1,
            },
        ],
    }


def create_consumers(rest: Rest, stack: Stack, count: int, threads: int, prefix: str = "scale-c") -> dict[str, str]:
    """`count` Consumers with their token Secrets; returns name -> token."""
    dev = stack.dev
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    with ThreadPoolExecutor(threads) as pool:
        tokens = list(pool.map(lambda name: dev.add_consumer(rest, name, None), names))
    return dict(zip(names, tokens, strict=True))


def create_databases(
    rest: Rest, stack: Stack, shards: list[str], consumers: list[str], count: int, threads: int
) -> float:
    """`count` Ready Databases with their Secrets, round-robin over `shards` and `consumers`; returns the
    seconds taken."""
    dev, pg = stack.dev, stack.postgres
    namespace = dev.namespace
    endpoint = Endpoint("127.0.0.1", pg.port, "require")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = Counter[str]()
    lock = threading.Lock()
    started = time.monotonic()

    def one(i: int) -> None:
        consumer = consumers[i % len(consumers)]
        external_id = f"db-{i:06d}"
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
            if done["n"] % 5000 == 0:
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
    last_reconciles = 0.0
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
        if "counted" in milestones and "passed" not in milestones and since - last_reconciles >= 1.0:
            last_reconciles = since  # a scrape costs the manager a little: once a second
            try:
                reconciles = manager.reconciles()
            except Exception:  # noqa: BLE001 - not serving yet
                reconciles = 0
            if reconciles >= count:
                milestones[f"first pass: {count} Database reconciles done"] = milestones["passed"] = since
        if "passed" in milestones:
            quiet = sampler.quiet_since()
            if quiet is not None and quiet - manager.started >= milestones["leading"]:
                milestones["caught up (idle from)"] = milestones["caught_up"] = quiet - manager.started
                return sampler, milestones
        time.sleep(0.25)
    raise TimeoutError(f"manager not caught up within {timeout:.0f}s: {milestones}\n{manager.tail()}")


class FirstAnswer(Background):
    """Polls a GET with a consumer's token from the manager's start: when did it first answer 200?"""

    def __init__(self, manager: ManagerProcess, token: str) -> None:
        super().__init__()
        self.manager = manager
        self.token = token
        self.seconds: float | None = None

    def run(self) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self.stopping.is_set():
            try:
                response = session.get(
                    self.manager.url("/v1/databases"), headers=headers, verify=str(self.manager.dev.ca_file), timeout=5
                )
                if response.status_code == 200:
                    self.seconds = time.monotonic() - self.manager.started
                    return
            except requests.RequestException:
                pass
            self.stopping.wait(0.1)


def watches(stack: Stack) -> Counter[str]:
    """Open watches on the apiserver: WATCH requests by resource (apiserver_longrunning_requests) and
    registered watchers by kind (apiserver_registered_watchers), as "resource" / "kind <Kind>"."""
    found: Counter[str] = Counter()
    for line in stack.apiserver_metrics().splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            resource = line.split('resource="', 1)[1].split('"', 1)[0]
            found[f"WATCH {resource}"] += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("apiserver_registered_watchers{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            found[f"watchers {kind}"] += int(float(line.rsplit(" ", 1)[1]))
    return found


def delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in sorted(set(after) | set(before)) if after[k] != before[k]}


def authenticated(manager: ManagerProcess, token: str) -> int:
    try:
        return requests.get(
            manager.url("/v1/databases"),
            headers={"Authorization": f"Bearer {token}"},
            verify=str(manager.dev.ca_file),
            timeout=10,
        ).status_code
    except requests.RequestException:
        return 0


def time_until(check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    wait_for(check, timeout, "the change to apply", 0.01)
    return time.monotonic() - started


def token_change(rest: Rest, stack: Stack, manager: ManagerProcess, consumer: str, old: str) -> dict[str, float]:
    """Seconds until a token Secret change applies on the manager: a hash added, the old one removed."""
    new = f"{old[:-8]}{'f' * 8}" if not old.endswith("f" * 8) else f"{old[:-8]}{'0' * 8}"
    name, namespace = f"{consumer}-token", stack.dev.namespace
    secret = rest.get(SECRETS, name, namespace)

    def write(tokens: list[str]) -> None:
        secret["data"] = {"sha256": base64.b64encode("\n".join(hash_token(t) for t in tokens).encode()).decode()}
        secret.update(rest.replace(SECRETS, secret))

    write([old, new])
    added = time_until(lambda: authenticated(manager, new) == 200, 60)
    write([new])
    removed = time_until(lambda: authenticated(manager, old) == 401, 60)
    write([old])  # as it was, for the next run
    time_until(lambda: authenticated(manager, old) == 200, 60)
    return {"a hash added -> the new token authenticates": added, "a hash removed -> the old token is refused": removed}


@dataclass
class Fleet:
    """What the setup made: the stack, an admin client, the consumers and their tokens."""

    stack: Stack
    rest: Rest
    count: int
    tokens: dict[str, str]
    shards: list[str]

    @property
    def consumers(self) -> list[str]:
        return sorted(self.tokens)


def measure_start(fleet: Fleet, run: int, args: argparse.Namespace) -> list[Target]:
    """Start a manager on the fleet, measure it as the module docstring says, stop it; the run's targets."""
    stack, rest, count = fleet.stack, fleet.rest, fleet.count
    first_consumer = fleet.consumers[0]
    provisioner = ProvisionerStatements(stack.postgres)
    writes_before = stack.apiserver_writes()
    watches_before = watches(stack)
    manager: ManagerProcess | None = ManagerProcess(stack, f"scale-manager-{run}")
    assert manager is not None
    first = FirstAnswer(manager, fleet.tokens[first_consumer]).start()
    try:
        sampler, milestones = wait_caught_up(manager, rest, count)
        caught_up = milestones["caught_up"]
        rss_caught_up = sampler.samples[-1][2]
        writes_start = counter_delta(stack.apiserver_writes(), writes_before)
        watches_manager = delta(watches(stack), watches_before)
        wait_for(lambda: first.seconds is not None, 120, "the first authenticated answer", 0.2)
        log(f"run {run}: caught up after {caught_up:.1f} s; adding {args.extra_consumers} Consumers")

        extra = create_consumers(rest, stack, args.extra_consumers, args.threads, prefix=f"scale-extra{run}")
        for token in extra.values():

            def answers(t: str = token) -> bool:
                return authenticated(manager, t) == 200

            wait_for(answers, 120, "the extra consumers", 0.1)
        watches_more = delta(watches(stack), watches_before)
        consumers_before = len(fleet.tokens)
        fleet.tokens.update(extra)
        changes = token_change(rest, stack, manager, first_consumer, fleet.tokens[first_consumer])

        # Only then is "no SQL for Ready databases" evidence: a database of a shard that is not Ready
        # waits without SQL whatever the controller would do (the Shards' admin Secret was once wrong
        # here, and every count read 0).
        wait_for(lambda: shards_ready(rest, fleet.shards), 120, f"all {len(fleet.shards)} Shards Ready", 0.5)
        log(f"run {run}: every Shard Ready; idle window of {args.idle_seconds:.0f} s")
        idle_before = sampler.sample()
        threads_before, switches_before = thread_cpu(manager.pid), wakeups(manager.pid)
        writes_idle_before = stack.apiserver_writes()
        time.sleep(args.idle_seconds)
        idle_after = sampler.sample()
        idle_span = idle_after[0] - idle_before[0]
        threads_idle = by_thread_group(manager.pid, threads_before, thread_cpu(manager.pid), idle_span)
        wakeups_idle = (wakeups(manager.pid) - switches_before) / idle_span
        writes_idle = counter_delta(stack.apiserver_writes(), writes_idle_before)
        idle_cpu = 100 * (idle_after[1] - idle_before[1]) / (idle_after[0] - idle_before[0])
        found = provisioner.expect(f"the Shard checks of {len(fleet.shards)} shards over the idle window")
        sql_changes = sum(n for k, n in found.items() if k in CHANGES)
        idle_profile = profile_idle(manager, run, args) if args.profile_idle > 0 else None
    finally:
        first.stop()
        manager.stop()

    milestones["first authenticated answer"] = first.seconds or 0.0
    print(f"\n######## run {run}: {machine_line()}")
    table(
        "manager start",
        [(k, f"{v:.1f} s") for k, v in sorted(milestones.items(), key=lambda kv: kv[1]) if k not in HIDDEN_MILESTONES],
        ("milestone", "since the process started"),
    )
    table(
        "resources",
        [
            ("RSS when caught up", f"{rss_caught_up / 2**20:.0f} MB"),
            ("RSS peak (sampled every 0.25 s)", f"{sampler.peak_rss / 2**20:.0f} MB"),
            (f"RSS after the idle {args.idle_seconds:.0f} s", f"{idle_after[2] / 2**20:.0f} MB"),
            ("CPU from start to caught up", f"{sampler.cpu_at(caught_up):.1f} CPU-s"),
            (f"idle CPU over {idle_after[0] - idle_before[0]:.0f} s", f"{idle_cpu:.2f}% of one core"),
            ("wake-ups while idle (voluntary context switches, all threads)", f"{wakeups_idle:.0f}/s"),
        ],
        ("what", "value"),
    )
    table(
        f"idle CPU by thread over {idle_span:.0f} s",
        [(k, f"{v:.2f}%") for k, v in sorted(threads_idle.items(), key=lambda kv: -kv[1])],
        ("thread (group)", "% of one core"),
    )
    table(
        "watches the apiserver holds for the manager (gauges after - before its start)",
        [
            (k, watches_manager.get(k, 0), watches_more.get(k, 0))
            for k in sorted(set(watches_manager) | set(watches_more))
        ]
        or [("none", 0, 0)],
        ("gauge", f"with {consumers_before} consumers", f"+ {args.extra_consumers} more"),
    )
    table(
        "token Secret changes on the manager",
        [(k, f"{v:.3f} s") for k, v in changes.items()],
        ("change", "until it applies"),
    )
    table(
        "apiserver writes by the start (until caught up)",
        [(k, v) for k, v in writes_start.most_common()] or [("none", 0)],
        ("resource verb", "requests"),
    )
    table(
        f"apiserver writes in the idle {args.idle_seconds:.0f} s",
        [(k, v) for k, v in writes_idle.most_common()] or [("none", 0)],
        ("resource verb", "requests"),
    )
    table(
        "provisioner statements on the server, manager start to the end of the idle window",
        [(k, n, "change" if k in CHANGES else "catalog read (Shard pings)") for k, n in found.most_common()]
        or [("none", 0, "")],
        ("keyword", "count", "kind"),
    )
    if idle_profile is not None:
        print(f"\n== py-spy on the idle manager, {args.profile_idle:.0f} s after the measured window (on-CPU samples)")
        print(idle_profile)

    secret_watches = watches_manager.get("WATCH secrets", 0)
    total_watches = sum(v for k, v in watches_manager.items() if k.startswith("WATCH "))
    more_watches = sum(v for k, v in watches_more.items() if k.startswith("WATCH "))
    slowest_change = max(changes.values())
    first_answer = milestones["first authenticated answer"]
    return [
        Target(
            f"run {run}: manager RSS peak {sampler.peak_rss / 2**20:.0f} MiB at {args.count} Databases",
            f"< {RSS_LIMIT_MIB} MiB",
            sampler.peak_rss / 2**20 < RSS_LIMIT_MIB,
            key="rss",
            what="manager RSS peak on the fleet",
            value=sampler.peak_rss / 2**20,
            unit="MiB",
        ),
        bound_target("caught-up", f"run {run}: start to caught up {caught_up:.1f} s", caught_up),
        Target(
            f"run {run}: SQL changes for Ready databases {sql_changes} (catalog reads {found.get('SELECT', 0)})",
            "== 0, with the Shard pings' reads seen",
            sql_changes == 0 and found.get("SELECT", 0) > 0,
            key="sql-changes",
            what="SQL changes for Ready databases from the start to the end of the idle window",
            value=sql_changes,
        ),
        bound_target("idle-cpu", f"run {run}: idle CPU {idle_cpu:.2f}% of one core", idle_cpu),
        Target(
            f"run {run}: open watches of the manager {total_watches} (Secrets {secret_watches}) with "
            f"{consumers_before} consumers, {more_watches} with {args.extra_consumers} more",
            "the same: independent of the consumer count",
            more_watches == total_watches,
            key="watches",
            what="the manager's open watches, with more consumers",
            value=more_watches,
            unit="watches",
        ),
        Target(
            f"run {run}: token Secret change applied in {slowest_change:.3f} s (slowest of add, remove)",
            f"<= {TOKEN_CHANGE_LIMIT_S:.0f} s",
            slowest_change <= TOKEN_CHANGE_LIMIT_S,
            key="token-change",
            what="a token Secret change applied (the slower of a hash added and removed)",
            value=slowest_change,
            unit="s",
        ),
        Target(
            f"run {run}: first authenticated answer {first_answer:.1f} s after start",
            f"< {CAUGHT_UP_LIMIT_S} s",
            first_answer < CAUGHT_UP_LIMIT_S,
            key="first-answer",
            what="first authenticated answer after the manager's start",
            value=first_answer,
            unit="s",
        ),
    ]


# The two targets measured both by a measured start and by the rounds beside a baseline (one results file each):
# key -> (upper bound, goal, what, unit).
BOUNDS = {
    "rss": (RSS_LIMIT_MIB, f"< {RSS_LIMIT_MIB} MiB", "manager RSS peak on the fleet", "MiB"),
    "caught-up": (CAUGHT_UP_LIMIT_S, f"< {CAUGHT_UP_LIMIT_S} s", "manager start until caught up on the fleet", "s"),
    "idle-cpu": (IDLE_CPU_LIMIT, f"< {IDLE_CPU_LIMIT}%", "manager idle CPU on the fleet, of one core", "%"),
}


def bound_target(key: str, figure: str, value: float) -> Target:
    limit, goal, what, unit = BOUNDS[key]
    return Target(figure, goal, value < limit, key=key, what=what, value=value, unit=unit)


def quick_start(
    fleet: Fleet, name: str, checkout: Path, spy_out: Path | None = None, idle_seconds: float = 0.0
) -> dict[str, float]:
    """One manager start from `checkout`, measured to caught up only (for comparing two trees on one fleet):
    its milestones, CPU to caught up and peak RSS; `spy_out`: with py-spy attached (not a measured start).
    With `idle_seconds`, then its idle CPU over that window once every Shard is Ready and IDLE_SETTLE s
    have passed, and the Shard reconciles in it (each a check: the CPU per check)."""
    manager = ManagerProcess(fleet.stack, name, checkout=checkout)
    spy = PySpy(manager.pid, spy_out, rate=50).start() if spy_out is not None else None
    try:
        sampler, milestones = wait_caught_up(manager, fleet.rest, fleet.count)
        if idle_seconds > 0:
            milestones.update(idle_window(manager, sampler, fleet, idle_seconds))
    finally:
        if spy is not None:
            spy.stop()
        manager.stop()
    milestones["cpu"] = sampler.cpu_at(milestones["caught_up"])
    milestones["rss"] = sampler.peak_rss / 2**20
    for line in manager.log_file.read_text(errors="replace").splitlines():
        if '"informers synced"' in line or "resync of" in line or "while the lists paged in" in line:
            # where the time went, in the manager's words
            log(f"  {name}: {line[:1500]}")
    return milestones


# After every Shard is Ready, before an idle window of a compared start: the checks' first intervals
# (drawn from the whole interval) have begun to spread.
IDLE_SETTLE = 20.0


def idle_window(manager: ManagerProcess, sampler: Sampler, fleet: Fleet, seconds: float) -> dict[str, float]:
    """The manager's idle CPU (% of one core) over `seconds`, the Shard reconciles a second and the CPU per
    Shard reconcile (ms: the whole process' CPU divided by the checks, so an upper bound of one check's)."""
    wait_for(lambda: shards_ready(fleet.rest, fleet.shards), 120, f"all {len(fleet.shards)} Shards Ready", 0.5)
    time.sleep(IDLE_SETTLE)
    checks_before = metric_sum(manager.metrics(), "dbprovider_reconciles_total", controller="shard")
    before = sampler.sample()
    time.sleep(seconds)
    after = sampler.sample()
    checks = metric_sum(manager.metrics(), "dbprovider_reconciles_total", controller="shard") - checks_before
    span, cpu = after[0] - before[0], after[1] - before[1]
    return {
        "idle_cpu": 100 * cpu / span,
        "checks_per_s": checks / span,
        "cpu_per_check": 1000 * cpu / checks if checks else float("nan"),
        "idle_load": os.getloadavg()[0],
    }


COMPARED = (
    ("ready", "/readyz 200 (caches synced)", "s"),
    ("leading", "holds the Lease", "s"),
    ("passed", "first pass done (reconciles >= count)", "s"),
    ("caught_up", "caught up (idle from)", "s"),
    ("first_pass", "first pass: Lease held -> reconciles done", "s"),
    ("cpu", "CPU from start to caught up", "CPU-s"),
    ("rss", "RSS peak", "MiB"),
)
COMPARED_IDLE = (
    ("idle_cpu", "idle CPU (% of one core)", "%"),
    ("checks_per_s", "Shard reconciles (checks) a second while idle", "/s"),
    ("cpu_per_check", "process CPU per Shard check while idle", "ms"),
    ("idle_load", "load average at the idle window's end", ""),
)


def compare(
    fleet: Fleet, baseline: Path, rounds: int, profile_dir: Path | None, idle_seconds: float = 0.0
) -> list[Target]:
    """`rounds` pairs of starts on the same fleet, the baseline tree's first, then this tree's; a table.
    With `idle_seconds`, each start is also measured idle (`idle_window`)."""
    log("a warm-up start (the first start after the setup writes the Consumer counts and Shard conditions)")
    quick_start(fleet, "scale-warmup", REPO)
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "this tree": []}
    for n in range(1, rounds + 1):
        for label, checkout in (("baseline", baseline), ("this tree", REPO)):
            found = quick_start(fleet, f"scale-{label.replace(' ', '-')}-{n}", checkout, idle_seconds=idle_seconds)
            found["first_pass"] = found["passed"] - found["leading"]
            results[label].append(found)
            idle_text = (
                f", idle CPU {found['idle_cpu']:.2f}% ({found['cpu_per_check']:.2f} ms a check)"
                if idle_seconds > 0
                else ""
            )
            log(
                f"round {n} {label}: caught up {found['caught_up']:.1f} s, first pass {found['first_pass']:.1f} s"
                f"{idle_text} ({os.getloadavg()[0]:.1f} load)"
            )
    print(f"\n######## {rounds} rounds, baseline {baseline} vs this tree: {machine_line()}")
    rows = []
    for key, what, unit in COMPARED + (COMPARED_IDLE if idle_seconds > 0 else ()):
        before = [r[key] for r in results["baseline"]]
        after = [r[key] for r in results["this tree"]]
        digits = 2 if unit in ("%", "ms", "") else 1
        rows.append(
            (
                what,
                " / ".join(f"{v:.{digits}f}" for v in before) + f" {unit}",
                " / ".join(f"{v:.{digits}f}" for v in after) + f" {unit}",
                f"{statistics.median(after) / statistics.median(before):.2f}x" if statistics.median(before) else "-",
            )
        )
    table(
        "manager start on the same fleet (each round: baseline, then this tree)",
        rows,
        ("milestone (since the process started)", "baseline", "this tree", "median ratio"),
    )
    caught_up = statistics.median(r["caught_up"] for r in results["this tree"])
    caught_up_before = statistics.median(r["caught_up"] for r in results["baseline"])
    rss = statistics.median(r["rss"] for r in results["this tree"])
    rss_before = statistics.median(r["rss"] for r in results["baseline"])
    targets = [
        bound_target(
            "rss",
            f"manager RSS peak at {fleet.count} Databases {rss:.0f} MiB (median of {rounds}; baseline "
            f"{rss_before:.0f} MiB)",
            rss,
        ),
        bound_target(
            "caught-up",
            f"start to caught up at {fleet.count} Databases {caught_up:.1f} s (median of {rounds}; baseline "
            f"{caught_up_before:.1f} s)",
            caught_up,
        ),
    ]
    if idle_seconds > 0:
        idle_cpu = statistics.median(r["idle_cpu"] for r in results["this tree"])
        idle_before = statistics.median(r["idle_cpu"] for r in results["baseline"])
        targets.append(
            bound_target(
                "idle-cpu",
                f"idle CPU at {fleet.count} Databases on {len(fleet.shards)} shards {idle_cpu:.2f}% of one core "
                f"(median of {rounds}; baseline {idle_before:.2f}%)",
                idle_cpu,
            )
        )
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        for label, checkout in (("baseline", baseline), ("this tree", REPO)):
            out = profile_dir / f"scale-start-{label.replace(' ', '-')}.pyspy.txt"
            found = quick_start(fleet, f"scale-profiled-{label.replace(' ', '-')}", checkout, spy_out=out)
            print(
                f"\n== py-spy, a start of the {label} (caught up after {found['caught_up']:.1f} s with the "
                "profiler attached; not a measured start)"
            )
            print(summarize_collapsed(out))
    return targets


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of the process, by native thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def wakeups(pid: int) -> int:
    """Voluntary context switches of all threads of the process (each is a thread going to sleep)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # the thread ended
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def by_thread_group(pid: int, before: dict[int, float], after: dict[int, float], seconds: float) -> dict[str, float]:
    """% of one core per thread group (Python thread names from `py-spy dump`, numbers folded to N)."""
    names: dict[int, str] = {}
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        dump = ""
    for match in re.finditer(r'^Thread (\d+) \(\w+\): "(.*)"$', dump, re.MULTILINE):
        names[int(match.group(1))] = re.sub(r"-\d+$", "-N", match.group(2))
    groups: dict[str, float] = {}
    for tid, cpu in after.items():
        group = names.get(tid, "other (no Python frame)")
        groups[group] = groups.get(group, 0.0) + 100 * (cpu - before.get(tid, 0.0)) / seconds
    return groups


def profile_idle(manager: ManagerProcess, run: int, args: argparse.Namespace) -> str:
    """py-spy on the idle manager for `--profile-idle` s, on-CPU samples only: where its idle CPU goes.

    Without C frames: with `--native` py-spy cannot tell a thread blocked in libc from one on the CPU."""
    args.profile_dir.mkdir(parents=True, exist_ok=True)
    out = args.profile_dir / f"scale-idle-{run}.pyspy.txt"
    spy = PySpy(manager.pid, out, rate=100, idle=False).start()
    try:
        time.sleep(args.profile_idle)
    finally:
        spy.stop()
    return summarize_collapsed(spy.out, top=25)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        __doc__,
        profile="also start a second manager with py-spy attached and profile its start",
        lock="the measured part (exclusive) and the setup (shared: other setups, not measurements, beside it)",
    )
    # The numbers of a run, as (option, default, what it is): the type is the default's and the help names it.
    for option, default, what in (
        ("--count", 10_000, "Database objects"),
        ("--shards", 20, "Shards sharing the one server"),
        ("--consumers", 1, "Consumers owning them"),
        ("--extra-consumers", 100, "Consumers added once caught up, to show the watches do not grow"),
        ("--threads", 16, "threads creating the objects"),
        ("--idle-seconds", 60.0, "idle CPU window"),
        ("--runs", 1, "manager starts measured on the same objects, one after the other"),
        ("--profile-idle", 0.0, "then sample the idle manager with py-spy for this many seconds (on-CPU only)"),
        ("--rounds", 3, "pairs of starts with --baseline"),
        ("--compare-idle", 0.0, "with --baseline: also measure each start's idle CPU over this many seconds"),
    ):
        parser.add_argument(option, type=type(default), default=default, help=f"{what} (default {default:,})")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of other code (e.g. `git archive main`): compare its starts with this "
        "tree's on the same fleet, `--rounds` pairs (then --runs measured starts of this tree)",
    )
    parser.add_argument(
        "--compacted",
        action="store_true",
        help="measure once etcd is compacted past the Databases (every 2 min here, 5 min by default) and the "
        "apiserver serves the later pages of a LIST from etcd: a cluster whose Databases have not changed lately",
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="one unmeasured start before the measured runs (--baseline makes one anyway): the first start "
        "after the setup writes the Consumer counts and Shard conditions",
    )
    parser.add_argument(
        "--start-after",
        type=Path,
        metavar="PATH",
        help="after the setup, wait until PATH exists before the first start: the code measured is the tree's "
        "when PATH appears, so it can be finished while a long setup runs",
    )
    args = parser.parse_args(argv)
    count = args.count

    print(
        f"scale: {count} Ready Databases on {args.shards} shards (one PostgreSQL 18 server), {args.consumers} consumers"
    )
    print(f"machine: {machine_line()}")
    # A larger request budget keeps the setup's creates from being throttled by the apiserver.
    kube_args = ["--max-requests-inflight=800", "--max-mutating-requests-inflight=400"]
    stack = Stack("scale", log_statements=True, kube_args=kube_args + (COMPACTING if args.compacted else []))
    try:
        with machine_lock(args.lock, shared=True):
            stack.start_dev()
            rest = stack.admin_rest(args.threads + 8)
            setup_started = time.monotonic()
            shards = create_shards(rest, stack, args.shards, -(-count // args.shards))
            log(f"creating {args.consumers} Consumers with their token Secrets")
            tokens = create_consumers(rest, stack, args.consumers, args.threads)
            log(f"creating {count} Databases (+ status, + Secret) with {args.threads} threads")
            setup_seconds = create_databases(rest, stack, shards, sorted(tokens), count, args.threads)
            setup_total = time.monotonic() - setup_started
            log(f"created in {setup_seconds:.0f} s")
        sizes = stack_sizes(stack)
        fleet = Fleet(stack, rest, count, tokens, shards)
        if args.compacted:
            wait_until_compacted(stack, DATABASES.collection_path(stack.dev.namespace))
            log("etcd compacted past the Databases: a LIST's later pages come from etcd")
        if args.start_after is not None:
            log(f"waiting for {args.start_after} to exist before the first start")
            wait_for(args.start_after.exists, float("inf"), str(args.start_after), 5.0)
        targets: list[Target] = []
        with machine_lock(args.lock):
            targets += measured(fleet, args)

        objects = count * 3 + args.consumers * 2 + args.shards
        print(
            f"\nsetup: {args.shards} Shards, {args.consumers} Consumers + token Secrets, {count} Databases + "
            f"status + Secrets ({objects} writes) in {setup_total:.0f} s; the Databases alone "
            f"{setup_seconds:.0f} s ({3 * count / setup_seconds:.0f} writes/s); then {sizes}"
        )
        report_targets(targets, ResultsFiles.of("bench.scale", args, argv))
    finally:
        stack.close()
    return 0


def measured(fleet: Fleet, args: argparse.Namespace) -> list[Target]:
    """Everything measured on the fleet: the comparison, the measured starts, the profiled start."""
    targets: list[Target] = []
    if args.baseline is not None:
        profile_dir = args.profile_dir if args.profile else None
        targets += compare(fleet, args.baseline.resolve(), args.rounds, profile_dir, args.compare_idle)
    elif args.warmup and args.runs:
        log("a warm-up start (the first start after the setup writes the Consumer counts and Shard conditions)")
        quick_start(fleet, "scale-warmup", REPO)
    for run in range(1, args.runs + 1):
        targets += measure_start(fleet, run, args)
    if args.profile and args.baseline is None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        log("profiling a further start with py-spy")
        found = quick_start(fleet, "scale-manager-profiled", REPO, spy_out=args.profile_dir / "scale-start.pyspy.txt")
        print(
            f"\n== py-spy, a further manager start (caught up after {found['caught_up']:.1f} s "
            "with the profiler attached; not a measured start)"
        )
        print(summarize_collapsed(args.profile_dir / "scale-start.pyspy.txt"))
    return targets


def stack_sizes(stack: Stack) -> str:
    """etcd's database on disk and the control plane's memory, after the setup (where limits would bite)."""
    etcd_bytes = sum(f.stat().st_size for f in (stack.kube.workdir / "etcd").rglob("*") if f.is_file())
    rss: dict[str, int] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            name = proc.name()
            if name.startswith("kube-apiserver") or name == "etcd":
                rss[name] = rss.get(name, 0) + proc.memory_info().rss
        except psutil.Error:
            continue
    memory = ", ".join(f"{name} RSS {value / 2**20:.0f} MB" for name, value in sorted(rss.items()))
    return f"etcd data {etcd_bytes / 2**20:.0f} MB on disk, {memory}"


if __name__ == "__main__":
    raise SystemExit(main())
