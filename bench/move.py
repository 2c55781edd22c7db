"""Moving a tenant database online under a steady write load, against `pg_dump | pg_restore` of it.

    python -m bench.move [--size 1024] [--rate 50] [--budget 30]

Three PostgreSQL 18 servers of the harness (wal_level=logical): the source shard, the target shard of
the online move, and a third shard for the offline copy. The shards' administrators' one-time grants
are given (REPLICATION and pg_create_subscription to both provisioners: the cutover leaves a stream back
to the source for a rollback, as the controller's does), then:

1. A tenant made the product's way on the source (`ensure_tenant`), filled as the tenant to about
   `--size` MB (a table of ~1 KB rows with a primary key; `pg_database_size` is reported).
2. The tenant's client starts writing at `--rate` commits per second (an INSERT into a table with a
   sequence, alternating with an UPDATE of the big table), logging in with the tenant's credentials to
   the endpoint it was given; when a write fails it reconnects and goes on.
3. The online move, step by step as the DatabaseMove controller runs it (reconciler.sql.move): the
   target prepared, the schema copied (`pg_dump --schema-only` of PostgreSQL 18), the publication and
   the subscription, waiting until every table is copied and the stream's lag is under 1 MB, then the
   fenced cutover with the stream back made inside its fence. The moment the cutover returns, the
   client's endpoint becomes the target (what the credentials Secret's new endpoint gives a consumer
   that re-reads it at once).
4. The baseline: the same tenant copied to the third shard the offline way (reconciler.sql.move_offline:
   `pg_dump` as the tenant piped into `pg_restore` in one transaction), the source closed meanwhile
   (as it is after the cutover). Its duration is an offline move's write pause.

Reported: the phases of the online move, the client's longest pause between two committed writes
(from the move's start until 10 s after the cutover) and where it fell, every write the client saw
committed found on the target, and the ratios of the online figures to the dump-and-restore time.
Targets: the longest write pause <= 5 s; the online move's total time <= 2x the dump and restore.
Not measured here: the controller's requeue interval and a consumer's delay in re-reading its Secret
(both add to the pause a real client sees), and TLS on the stream (loopback, sslmode=disable).
"""

from __future__ import annotations

import argparse
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from bench.common import (
    ResultsFiles,
    Target,
    bench_parser,
    fmt_s,
    log,
    machine_line,
    report_targets,
    table,
    wait_for,
)
from harness import PostgresServer
from reconciler.sql import move, move_offline, move_rollback
from reconciler.sql.session import AdminEndpoint, AdminSession, connect_admin
from reconciler.sql.tenant import TenantSpec, ensure_tenant

FLAVOR = "18"
SETTINGS = {"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10", "max_wal_size": "4GB"}
ROW_BYTES = 1100  # on disk per filler row: ~960 bytes of text, the tuple header, the index entry
BATCH = 50_000  # filler rows per INSERT
CAUGHT_UP_BYTES = 1 << 20
AFTER_CUTOVER = 10.0  # seconds the client keeps writing on the target before the pause is read
PAUSE_TARGET = 5.0  # seconds
TOTAL_TARGET = 2.0  # online move total / dump and restore


def endpoint(server: PostgresServer) -> AdminEndpoint:
    """The provisioner's admin endpoint of a harness server (loopback, without TLS)."""
    return AdminEndpoint(
        host="127.0.0.1",
        port=server.port,
        user=server.PROVISIONER,
        password=server.provisioner_password,
        sslmode="disable",
        cleartext_allowed=True,
    )


def fill(source: PostgresServer, spec: TenantSpec, megabytes: int) -> int:
    """The tenant's tables on the source, the big one filled to about `megabytes`; the database's size in bytes."""
    rows = max(1, megabytes * 1024 * 1024 // ROW_BYTES)
    with source.connect(spec.name, spec.password, spec.name, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute("CREATE TABLE ticks (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), body text)")
        for first in range(1, rows + 1, BATCH):
            last = min(rows, first + BATCH - 1)
            conn.execute(
                "INSERT INTO items SELECT g, repeat(md5(g::text || random()::text), 30)"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                (first, last),
            )
            log(f"filled {last:,} of {rows:,} rows")
        conn.execute("VACUUM ANALYZE items")
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(size[0]) if size else 0


@dataclass
class Client:
    """The tenant's client: `rate` autocommit writes a second to whichever server `port` names,
    reconnecting after a failed write. Records when each write committed and the ticks it inserted."""

    spec: TenantSpec
    port: int
    rows: int
    rate: float
    commits: list[float] = field(default_factory=list)
    ticks: list[int] = field(default_factory=list)
    failed: int = 0
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        step = 0
        next_at = time.monotonic()
        while not self._halt.is_set():
            next_at = max(next_at + 1 / self.rate, time.monotonic() - 1)
            time.sleep(max(0.0, next_at - time.monotonic()))
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(
                        host="127.0.0.1",
                        port=self.port,
                        user=self.spec.name,
                        password=self.spec.password,
                        dbname=self.spec.name,
                        sslmode="disable",
                        connect_timeout=5,
                        autocommit=True,
                    )
                step += 1
                if step % 2:
                    row = conn.execute("INSERT INTO ticks (body) VALUES (%s) RETURNING id", (f"w{step}",)).fetchone()
                    self.ticks.append(int(row[0]) if row else 0)
                else:
                    conn.execute("UPDATE items SET body = %s WHERE id = %s", (f"w{step}", 1 + step * 7919 % self.rows))
                self.commits.append(time.monotonic())
            except psycopg.Error:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None

    def longest_pause(self, start: float, end: float) -> tuple[float, float]:
        """The longest time between two committed writes within [start, end]: (seconds, when it began)."""
        times = [start, *(t for t in self.commits if start <= t <= end)]
        gaps = [(later - earlier, earlier) for earlier, later in zip(times, times[1:], strict=False)]
        return max(gaps) if gaps else (end - start, start)


@contextmanager
def servers(count: int) -> Iterator[list[PostgresServer]]:
    with ExitStack() as stack:
        started = []
        for _ in range(count):
            server = PostgresServer(FLAVOR, settings=SETTINGS)
            stack.callback(server.close)
            started.append(server.start())
        yield started


def grant_once(source: PostgresServer, target: PostgresServer) -> None:
    """What the shards' administrators grant once for online moves (docs/operations.md), both ways: the
    cutover leaves a stream back to the source for a rollback, as the DatabaseMove controller's does."""
    for server in (source, target):
        with server.superuser_connection() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(server.PROVISIONER)))
            conn.execute(sql.SQL("GRANT pg_create_subscription TO {}").format(sql.Identifier(server.PROVISIONER)))


def online_move(
    source: PostgresServer, target: PostgresServer, plan: move.MovePlan, client: Client, budget: float
) -> dict[str, float]:
    """The online move's steps; the time of each phase (and `started`, `cutover_at` on the monotonic clock)."""
    pg_dump = target.bin_dir / "pg_dump"
    phases: dict[str, float] = {}
    with connect_admin(endpoint(source)) as src, connect_admin(endpoint(target)) as dst:
        started = time.monotonic()
        move.prepare_target(dst, plan.tenant)
        move.copy_schema(src, dst, plan, pg_dump)
        move.publish(src, plan.name)
        move.subscribe(src, dst, plan)
        phases["target and schema"] = time.monotonic() - started
        log("subscribed; waiting for the initial copy and the stream to catch up")

        def caught_up() -> bool:
            now = move.progress(src, dst, plan)
            if now.errors:
                raise RuntimeError(f"the subscription met {now.errors} error(s)")
            return now.copied and now.lag_bytes is not None and now.lag_bytes < CAUGHT_UP_BYTES

        copying = time.monotonic()
        wait_for(caught_up, 6 * 3600, "the initial copy and the stream to catch up", interval=0.5)
        phases["initial copy and catch-up"] = time.monotonic() - copying
        log("caught up; cutover")
        back = move.MovePlan(plan.tenant, "127.0.0.1", target.port, sslmode="disable")
        reverse = move_rollback.Reverse(src, dst, back)  # the stream back is made inside the fence
        phases["cutover (its own pause)"] = move.cutover(src, dst, plan, budget=budget, reverse=reverse)
        client.port = target.port  # the endpoint the credentials Secret now names
        phases["cutover_at"] = time.monotonic()
        phases["total"] = phases["cutover_at"] - started
        phases["started"] = started
    return phases


def dump_and_restore(source: PostgresServer, copy: PostgresServer, plan: move.MovePlan) -> float:
    """The offline copy of the (closed) tenant to `copy`: seconds of `pg_dump | pg_restore`."""
    pg_dump, pg_restore = copy.bin_dir / "pg_dump", copy.bin_dir / "pg_restore"
    with connect_admin(endpoint(source)) as src, connect_admin(endpoint(copy)) as dst:
        move.prepare_target(dst, plan.tenant)
        move_offline.close_source(src, plan.name)
        started = time.monotonic()
        move_offline.copy_database(src, dst, plan, pg_dump, pg_restore)
        seconds = time.monotonic() - started
        move_offline.open_offline(src, dst, plan)
    return seconds


def missing_ticks(target: PostgresServer, spec: TenantSpec, ticks: list[int]) -> int:
    """How many of the client's committed inserts the target lacks."""
    with target.connect(spec.name, spec.password, spec.name, autocommit=True) as conn:
        have = {row[0] for row in conn.execute("SELECT id FROM ticks")}
    return len(set(ticks) - have)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--size", type=int, default=1024, metavar="MB", help="the tenant's size (default 1024)")
    parser.add_argument("--rate", type=float, default=50.0, help="the client's writes per second (default 50)")
    parser.add_argument("--budget", type=float, default=30.0, help="the cutover's write-pause budget in s (default 30)")
    args: argparse.Namespace = parser.parse_args(argv)
    results = ResultsFiles.of("bench.move", args, argv)
    print(f"machine: {machine_line()}")
    spec = TenantSpec(f"t_move_{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(24), 10)
    with servers(3) as (source, target, copy):
        grant_once(source, target)
        with AdminSession.for_endpoint(endpoint(source)) as admin:
            ensure_tenant(admin, spec)
        log(f"filling the tenant to about {args.size} MB")
        size = fill(source, spec, args.size)
        rows = max(1, args.size * 1024 * 1024 // ROW_BYTES)
        plan = move.MovePlan(spec, "127.0.0.1", source.port, sslmode="disable")
        client = Client(spec, source.port, rows, args.rate)
        client.start()
        try:
            wait_for(lambda: len(client.commits) >= args.rate, 60, "the client's first second of writes")
            phases = online_move(source, target, plan, client, args.budget)
            end = phases["cutover_at"] + AFTER_CUTOVER
            time.sleep(max(0.0, end - time.monotonic()))  # the client writes on the target meanwhile
        finally:
            client.stop()
        pause, pause_at = client.longest_pause(phases["started"], end)
        lost = missing_ticks(target, spec, client.ticks)
        log("copying the same tenant with pg_dump | pg_restore")
        offline = dump_and_restore(source, copy, plan)

    writes = sum(1 for t in client.commits if phases["started"] <= t <= end)
    began = pause_at - phases["cutover_at"]
    table(
        f"online move of {size / 2**20:,.0f} MB (PostgreSQL {FLAVOR} to {FLAVOR}) with {args.rate:g} writes/s",
        [
            *[(name, fmt_s(phases[name])) for name in ("target and schema", "initial copy and catch-up")],
            ("cutover (its own pause)", fmt_s(phases["cutover (its own pause)"])),
            ("total", fmt_s(phases["total"])),
            ("longest write pause", f"{fmt_s(pause)} (began {began:+.1f} s from the cutover's end)"),
            ("writes committed during the move", f"{writes:,} ({client.failed} failed and retried)"),
            ("committed inserts missing on the target", str(lost)),
            ("pg_dump | pg_restore (offline pause)", fmt_s(offline)),
        ],
    )
    total_ratio, pause_ratio = phases["total"] / offline, pause / offline
    print(f"\nratios to pg_dump | pg_restore: total {total_ratio:.2f}x, longest write pause {pause_ratio:.3f}x")
    if lost:
        raise SystemExit(f"{lost} committed write(s) are not on the target")
    report_targets(
        [
            Target(
                f"longest write pause {pause:.2f} s ({pause_ratio:.3f}x the dump and restore, {offline:.1f} s)",
                f"<= {PAUSE_TARGET:g} s",
                pause <= PAUSE_TARGET,
                key="write-pause",
                what=f"longest write pause of a client writing through an online move of a {args.size} MB tenant",
                value=pause,
                unit="s",
            ),
            Target(
                f"online move {phases['total']:.1f} s / pg_dump | pg_restore {offline:.1f} s = {total_ratio:.2f}x",
                f"<= {TOTAL_TARGET:g}x",
                total_ratio <= TOTAL_TARGET,
                key="total-ratio",
                what="online move's total time over pg_dump | pg_restore of the same tenant",
                value=total_ratio,
                unit="x",
            ),
        ],
        results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
