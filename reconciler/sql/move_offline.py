"""Moving a tenant database to another shard offline: closed, dumped, restored, opened.

For shards without what logical replication needs (PostgreSQL 15, or no grants for it). Plain
functions over the provisioner's admin connections to the two shards, each idempotent:

1. `move.prepare_target`: the tenant's role (same name and password) and database on the target,
   closed to the tenant (the online path's first step).
2. `close_source`: CONNECT revoked from the tenant on the source and its sessions ended; from here
   on writes pause until the target is opened.
3. `copy_database`: a marker table made as the tenant on the source, then `pg_dump` (as the tenant:
   the provisioner's login with `--role`) piped into `pg_restore` (as the tenant, in one transaction)
   on the target. The marker on the target says the copy is complete: run again, the step is skipped;
   interrupted, the transaction left nothing and the copy starts over.
4. `open_offline`: the target opened to the tenant (`move.open_target`), the marker dropped on the
   source, which stays closed as the rollback copy.

An abort before the target is opened is `move.abort`: the source reopened, the target's tenant dropped.
The provisioner's password reaches pg_dump and pg_restore in their environment only; their own
messages are not passed on (they could quote the tenant's data).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from reconciler.sql import errors
from reconciler.sql.children import die_with_parent
from reconciler.sql.errors import SqlFailure
from reconciler.sql.move import (
    APPLICATION_NAME,
    MovePlan,
    _drop_marker,
    _has_marker,
    ensure_marker,
    fence_source,
    open_target,
    target_database,
)
from reconciler.sql.move_preflight import tenant_database
from reconciler.sql.roles import as_role

OP_OFFLINE = "offline move"
COPY_TIMEOUT = 3600.0  # seconds for dumping and restoring one tenant
POLL = 0.2  # seconds between looks at the two processes
PROGRESS_EVERY = 5.0  # seconds between two calls of a copy's `progress`
_CONNINFO_KEYS = ("host", "hostaddr", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "require_auth")
REQUIRE_AUTH_MAJOR = 16  # the first libpq that knows require_auth


@functools.cache
def client_major(binary: Path) -> int:
    """The PostgreSQL major of a client binary (`pg_dump (PostgreSQL) 15.8` -> 15); 0: unknown."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = re.search(r"\) (\d+)", done.stdout)
    return int(found.group(1)) if found else 0


def database_size(source: psycopg.Connection, name: str) -> int:
    """The tenant's database on the source, in bytes (what the offline copy has to carry)."""
    with tenant_database(source, name) as inside, as_role(inside, name):
        row = inside.execute("SELECT pg_catalog.pg_database_size(pg_catalog.current_database())").fetchone()
    return int(row[0]) if row is not None else 0


def close_source(source: psycopg.Connection, name: str) -> None:
    """No tenant session on the source from now on (the write pause of an offline move starts)."""
    fence_source(source, name)


def _login(conn: psycopg.Connection, dbname: str, binary: Path) -> tuple[str, dict[str, str]]:
    """The provisioner's login to `dbname` on the server of `conn`, for `binary`: (conninfo,
    environment); the password only in the environment. A PostgreSQL 15 binary goes without
    require_auth (its libpq refuses the option)."""
    keys = _CONNINFO_KEYS if client_major(binary) >= REQUIRE_AUTH_MAJOR else _CONNINFO_KEYS[:-1]
    params = {key: value for key, value in conn.info.get_parameters().items() if key in keys}
    conninfo = make_conninfo(**params, user=conn.info.user, dbname=dbname, application_name=APPLICATION_NAME)
    env = {"PATH": os.environ.get("PATH", ""), "PGCONNECT_TIMEOUT": "10"}
    if conn.info.password:
        env["PGPASSWORD"] = conn.info.password
    return conninfo, env


@contextmanager
def _connect_granted(conn: psycopg.Connection, name: str) -> Iterator[None]:
    """CONNECT on the tenant's database for the provisioner while pg_dump runs (granted as the tenant,
    its owner; taken back after, unless it was there before)."""
    database, me = sql.Identifier(name), sql.Identifier(conn.info.user)
    row = conn.execute("SELECT pg_catalog.has_database_privilege(current_user, %(db)s, 'CONNECT')", {"db": name})
    had = bool((row.fetchone() or (False,))[0])
    if not had:
        with as_role(conn, name):
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, me))
    try:
        yield
    finally:
        if not had:
            with as_role(conn, name):
                conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(database, me))


def dump_and_restore(
    source: psycopg.Connection,
    target: psycopg.Connection,
    plan: MovePlan,
    pg_dump: Path,
    pg_restore: Path,
    timeout: float = COPY_TIMEOUT,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[], None] = lambda: None,
) -> None:
    """The tenant's database dumped as the tenant and restored as the tenant in one transaction.

    Owners and privileges are left out (the restore runs as the tenant, which owns what it creates);
    so are publications, subscriptions, security labels and tablespaces. Both processes are ended
    when `cancelled()` turns true (the manager stops) or after `timeout` seconds; the restore's
    transaction then leaves nothing on the target. `progress()` is called every PROGRESS_EVERY
    seconds while they run (its exceptions end them too).
    """
    role = f"--role={plan.name}"
    dump_info, dump_env = _login(source, plan.name, pg_dump)
    restore_info, restore_env = _login(target, plan.name, pg_restore)
    dump_argv = [
        str(pg_dump),
        "--format=custom",
        role,
        "--no-owner",
        "--no-privileges",
        "--no-publications",
        "--no-subscriptions",
        "--no-security-labels",
        "--no-tablespaces",
        f"--dbname={dump_info}",
    ]
    restore_argv = [
        str(pg_restore),
        role,
        "--no-owner",
        "--no-privileges",
        "--single-transaction",
        "--exit-on-error",
        f"--dbname={restore_info}",
    ]
    with (
        _connect_granted(source, plan.name),
        tempfile.TemporaryFile() as dump_errors,
        tempfile.TemporaryFile() as restore_errors,
    ):
        # Both die with the manager (children.die_with_parent), and this thread, their parent for the
        # kernel, leaves only once both have ended.
        started: list[subprocess.Popen[bytes]] = []
        try:
            dumper = subprocess.Popen(
                dump_argv, env=dump_env, stdout=subprocess.PIPE, stderr=dump_errors, preexec_fn=die_with_parent()
            )
            started.append(dumper)
            assert dumper.stdout is not None
            try:
                restorer = subprocess.Popen(
                    restore_argv,
                    env=restore_env,
                    stdin=dumper.stdout,
                    stdout=subprocess.DEVNULL,
                    stderr=restore_errors,
                    preexec_fn=die_with_parent(),
                )
            except OSError:
                raise SqlFailure(OP_OFFLINE, errors.OTHER, detail="pg_restore could not be started") from None
            started.append(restorer)
            dumper.stdout.close()  # pg_restore holds the pipe now; pg_dump sees it close if pg_restore exits
            deadline = time.monotonic() + timeout
            report = time.monotonic() + PROGRESS_EVERY
            while restorer.poll() is None or dumper.poll() is None:
                if cancelled() or time.monotonic() >= deadline:
                    raise SqlFailure(OP_OFFLINE, errors.TIMEOUT, detail="the dump and restore did not finish")
                if time.monotonic() >= report:
                    progress()
                    report = time.monotonic() + PROGRESS_EVERY
                time.sleep(POLL)
        finally:
            for process in reversed(started):
                if process.poll() is None:
                    process.kill()
                process.wait()
        restored, dumped = restorer.returncode, dumper.returncode
    if dumped != 0:
        raise SqlFailure(OP_OFFLINE, errors.OTHER, detail=f"pg_dump exited with {dumped}")
    if restored != 0:
        raise SqlFailure(OP_OFFLINE, errors.OTHER, detail=f"pg_restore exited with {restored}")


def copy_database(
    source: psycopg.Connection,
    target: psycopg.Connection,
    plan: MovePlan,
    pg_dump: Path,
    pg_restore: Path,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[], None] = lambda: None,
) -> None:
    """The closed source's database copied to the target, once: the marker on the target (restored
    in the same transaction as everything else) says it is there. `progress` as dump_and_restore's."""
    with target_database(target, plan.name) as inside:
        if _has_marker(inside):
            return
    with tenant_database(source, plan.name) as inside:
        ensure_marker(inside, plan.name)
    dump_and_restore(source, target, plan, pg_dump, pg_restore, cancelled=cancelled, progress=progress)


def open_offline(source: psycopg.Connection, target: psycopg.Connection, plan: MovePlan) -> None:
    """The target opened to the tenant; the source, closed, loses its marker and stays as the rollback copy."""
    open_target(target, plan.tenant)
    with tenant_database(source, plan.name) as inside:
        _drop_marker(inside, plan.name)
