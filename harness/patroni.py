"""A shard as users run it: a Patroni cluster behind a primary endpoint, with pgBouncer for clients.

`PatroniShard(flavor).start()` brings up, on loopback:

- an etcd of its own (the binary hack/build-kube.sh builds for the apiserver), Patroni's DCS;
- Patroni (PyPI `patroni[etcd3]`) managing a primary and `replicas` streaming replicas of the
  harness's PostgreSQL builds, each with TLS from `shard_ca()`, SCRAM on TCP, trust on its socket;
- the primary endpoint: a TCP proxy that forwards to the member whose Patroni REST API answers
  200 on `GET /primary`, checked every 0.2 s, as a Percona primary Service follows the leader (a
  member that stops leading loses its connections, as its demotion ends them anyway);
- pgBouncer (Debian's package) in front of the primary endpoint as the client endpoint, configured
  as Percona's operator (built on Crunchy PGO) configures it: a `*` database entry to the primary,
  `auth_user = _crunchypgbouncer` with `auth_query` on the SECURITY DEFINER function
  `pgbouncer.get_auth`, which exists in every database that allows connections, template1
  included; TLS required from clients; to the server TLS with `verify-full`, so each member's
  certificate names the address pgBouncer dials (`PRIMARY_HOST`); `pool_mode` transaction or session.

The shard is prepared like `harness.postgres.PostgresServer` (docs/sql.md "Preparing a shard") and
has the same `provisioner` role. `close()` stops everything and removes its files.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from harness.kube import binaries_dir, etcd_command
from harness.postgres import POSTGRES_FLAVORS, shard_ca
from harness.process import _tail, free_port, spawn, stop, wait_for_port
from harness.tcp_proxy import TcpProxy

PGBOUNCER = Path("/usr/sbin/pgbouncer")
# The names Percona's operator (Crunchy PGO) uses for the pooler's login role and its schema.
POOLER_AUTH_USER = "_crunchypgbouncer"
POOLER_SCHEMA = "pgbouncer"
POOLER_ADMIN = "pgbouncer_admin"
AUTH_QUERY = "SELECT username, password from pgbouncer.get_auth($1)"
# pgBouncer checks the server's certificate and its name, as Percona's operator configures it (docs/install.md).
SERVER_TLS_SSLMODE = "verify-full"
# The address pgBouncer dials for the primary (a Percona pgBouncer dials the primary Service's name):
# every member's certificate names it, as the cluster certificate names the primary Service.
PRIMARY_HOST = "127.0.0.1"
# Patroni's timing: a lost leader is replaced within about ttl + loop_wait seconds.
TTL = 20
LOOP_WAIT = 2
RETRY_TIMEOUT = 5
PRIMARY_CHECK_INTERVAL = 0.2
INSTALL_DOC = Path(__file__).resolve().parent.parent / "docs" / "install.md"
SETUP_MARKER = "<!-- pgbouncer-shard-setup -->"


def _server_user() -> str | None:
    """PostgreSQL, Patroni and pgBouncer refuse root: run them as `postgres` (Debian's package made it)."""
    if os.geteuid() != 0:
        return None
    pwd.getpwnam("postgres")
    return "postgres"


def _interpreter(user: str | None) -> str:
    """A Python of this version that `user` may run: this one, unless it lives where only root looks
    (pyenv under /root); then the system's of the same minor version, with this one's packages."""
    executable = Path(sys.executable).resolve()
    if user is None or all(os.stat(d).st_mode & 0o001 for d in executable.parents):
        return str(executable)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        raise RuntimeError(f"Patroni must run as {user}, who cannot run {executable}, and {system} is missing")
    return str(system)


def _postmaster_pid(member: Member) -> int | None:
    """The PID in the member's postmaster.pid if that process still runs a postgres on its data directory
    (a stale file may name a PID that something else has now)."""
    data_dir = member.workdir / "data"
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    return pid if str(data_dir).encode() in cmdline else None


def documented_setup() -> sql.SQL:
    """The SQL docs/install.md ("Shards behind pgBouncer") asks a shard's administrators to run, read from
    the doc itself, so what the doc says is what the tests run."""
    text = INSTALL_DOC.read_text()
    _, _, after = text.partition(SETUP_MARKER)
    block = after.partition("```sql\n")[2].partition("```")[0].strip()
    if not block:
        raise RuntimeError(f"{INSTALL_DOC} has no sql block after {SETUP_MARKER}")
    return sql.SQL(block)  # a fixed text of the repository, not an input


def auth_function_sql() -> sql.Composed:
    """The pooler's auth function as Percona's operator creates it in every database (as superuser):
    the verifier of a login role that is no superuser, no replication role and not the pooler."""
    return sql.SQL(
        """
        CREATE SCHEMA IF NOT EXISTS {schema};
        REVOKE ALL PRIVILEGES ON SCHEMA {schema} FROM PUBLIC, {user};
        GRANT USAGE ON SCHEMA {schema} TO {user};
        CREATE OR REPLACE FUNCTION {schema}.get_auth(username TEXT)
        RETURNS TABLE(username TEXT, password TEXT) AS '
          SELECT rolname::TEXT, rolpassword::TEXT
          FROM pg_catalog.pg_authid
          WHERE pg_authid.rolname = $1
            AND pg_authid.rolcanlogin
            AND NOT pg_authid.rolsuper
            AND NOT pg_authid.rolreplication
            AND pg_authid.rolname <> ''_crunchypgbouncer''
            AND (pg_authid.rolvaliduntil IS NULL OR pg_authid.rolvaliduntil >= CURRENT_TIMESTAMP)'
        LANGUAGE SQL STABLE SECURITY DEFINER;
        REVOKE ALL PRIVILEGES ON FUNCTION {schema}.get_auth(username TEXT) FROM PUBLIC, {user};
        GRANT EXECUTE ON FUNCTION {schema}.get_auth(username TEXT) TO {user};
        """
    ).format(schema=sql.Identifier(POOLER_SCHEMA), user=sql.Identifier(POOLER_AUTH_USER))


@dataclass
class Member:
    """One Patroni member: its PostgreSQL port, REST API port, files and process."""

    name: str
    workdir: Path
    pg_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "socket"

    @property
    def log_file(self) -> Path:
        return self.workdir / "patroni.log"

    @property
    def config_file(self) -> Path:
        return self.workdir / "patroni.yaml"

    def api(self, path: str, timeout: float = 1.0) -> int:
        """The HTTP status of GET `path` on the member's REST API (0: no answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def superuser_connection(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host=str(self.socket_dir), port=self.pg_port, user="postgres", dbname=dbname, autocommit=True
        )


class PrimaryEndpoint:
    """A TCP proxy to the member whose REST API says it is the primary (`GET /primary` is 200).

    While no member says so, it keeps forwarding to the last primary, as a Percona primary Service
    does: Patroni writes its endpoints through the DCS, so a leader that demoted itself because the DCS
    was lost (or died) stays the Service's endpoint until a new leader takes over."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.proxy = TcpProxy("127.0.0.1", 0)
        self.leader: Member | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="patroni-primary", daemon=True)

    @property
    def port(self) -> int:
        return self.proxy.port

    def start(self) -> PrimaryEndpoint:
        self._check()
        self.proxy.start()
        self._thread.start()
        return self

    def _check(self) -> None:
        leader = next((m for m in self.members if m.proc is not None and m.api("/primary") == 200), None)
        if leader is None or leader is self.leader:
            return
        self.leader = leader
        self.proxy.retarget(None if leader is None else ("127.0.0.1", leader.pg_port))

    def _follow(self) -> None:
        while not self._stop.wait(PRIMARY_CHECK_INTERVAL):
            self._check()

    def close(self) -> None:
        self._stop.set()
        self.proxy.close()


class PgBouncer:
    """pgBouncer in front of `upstream_port`, configured as Percona's operator does (module docstring)."""

    def __init__(self, workdir: Path, upstream_port: int, pool_mode: str, auth_password: str, user: str | None):
        self.workdir = workdir
        self.upstream_port = upstream_port
        self.pool_mode = pool_mode
        self.auth_password = auth_password
        self.admin_password = secrets.token_urlsafe(18)
        self.user = user
        self.port = free_port()
        self.ini = workdir / "pgbouncer.ini"
        self.log_file = workdir / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def configure(self) -> None:
        self.workdir.mkdir(exist_ok=True)
        files = shard_ca().issue_server(f"pgbouncer-{self.workdir.parent.name}", ("localhost",), ("127.0.0.1",))
        cert, key = self.workdir / "tls.crt", self.workdir / "tls.key"
        shutil.move(files.cert_file, cert)
        shutil.move(files.key_file, key)
        key.chmod(0o600)
        users = self.workdir / "users.txt"
        users.write_text(f'"{POOLER_AUTH_USER}" "{self.auth_password}"\n"{POOLER_ADMIN}" "{self.admin_password}"\n')
        users.chmod(0o600)
        ca = shard_ca().ca_file
        self.ini.write_text(
            "[databases]\n"
            f"* = host={PRIMARY_HOST} port={self.upstream_port}\n"
            "\n[pgbouncer]\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"auth_file = {users}\n"
            f"auth_query = {AUTH_QUERY}\n"
            f"auth_user = {POOLER_AUTH_USER}\n"
            "client_tls_sslmode = require\n"
            f"client_tls_cert_file = {cert}\n"
            f"client_tls_key_file = {key}\n"
            f"client_tls_ca_file = {ca}\n"
            f"server_tls_sslmode = {SERVER_TLS_SSLMODE}\n"
            f"server_tls_ca_file = {ca}\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            f"admin_users = {POOLER_ADMIN}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"pidfile = {self.workdir / 'pgbouncer.pid'}\n"
        )
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.workdir, cert, key, users, self.ini):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 30.0) -> None:
        self.proc = spawn([str(PGBOUNCER), str(self.ini)], self.log_file, user=self.user)
        wait_for_port(self.port, timeout, self.proc, self.log_file)

    def stop(self) -> None:
        stop(self.proc, signal.SIGTERM, timeout=10)  # immediate shutdown: the clients are test sessions
        self.proc = None

    def admin(self, command: str, psql: Path) -> str:
        """Run one admin console command (PAUSE, RESUME, SHOW POOLS...) with psql; its output."""
        result = subprocess.run(
            [str(psql), "-X", "-A", "-t", "-c", command],
            env={
                **os.environ,
                "PGHOST": "127.0.0.1",
                "PGPORT": str(self.port),
                "PGUSER": POOLER_ADMIN,
                "PGPASSWORD": self.admin_password,
                "PGDATABASE": "pgbouncer",
                "PGSSLMODE": "require",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pgbouncer admin {command!r} failed: {result.stderr.strip()}")
        return result.stdout


class PatroniShard:
    """A Patroni cluster, its primary endpoint and pgBouncer; see the module docstring.

    `port` is the primary endpoint (the Shard's admin port), `client_port` pgBouncer's (its client
    endpoint). Like `PostgresServer` it has `PROVISIONER`, `provisioner_password`, `major`,
    `superuser_connection()`, `connect()` and `query()`, on the current primary.
    """

    SUPERUSER = "postgres"
    PROVISIONER = "provisioner"

    def __init__(
        self, flavor: str = "18", replicas: int = 1, pool_mode: str = "transaction", max_connections: int = 1200
    ) -> None:
        """`max_connections`: the default fits a burst of 100 tenants of 10 connections."""
        if pool_mode not in ("transaction", "session"):
            raise ValueError("pool_mode is transaction or session")
        self.flavor = POSTGRES_FLAVORS[flavor]
        self.bin_dir = self.flavor.locate()
        self.pool_mode = pool_mode
        self.max_connections = max_connections
        self.user = _server_user()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"dbprovider-patroni{flavor}-"))
        self.workdir.chmod(0o755)
        self.scope = f"dbp-{self.workdir.name[-8:].lower()}"
        self.members = [Member(f"m{i}", self.workdir / f"m{i}") for i in range(1 + replicas)]
        self.superuser_password = secrets.token_urlsafe(18)
        self.replication_password = secrets.token_urlsafe(18)
        self.provisioner_password = secrets.token_urlsafe(24)
        self.pooler_password = secrets.token_urlsafe(24)
        self.etcd_proc: subprocess.Popen[bytes] | None = None
        self.etcd_ports = (free_port(), free_port())
        self.primary = PrimaryEndpoint(self.members)
        self.pgbouncer: PgBouncer | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> PatroniShard:
        try:
            self.start_dcs()
            for member in self.members:
                self._configure(member)
            self._launch(self.members[0])
            self.wait_leader(timeout)
            self._prepare()
            for member in self.members[1:]:
                self._launch(member)
            self.wait_streaming(len(self.members) - 1, timeout)
            self.primary.start()
            self.pgbouncer = PgBouncer(
                self.workdir / "pgbouncer", self.primary.port, self.pool_mode, self.pooler_password, self.user
            )
            self.pgbouncer.configure()
            self.pgbouncer.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.pgbouncer is not None:
            self.pgbouncer.stop()
        self.primary.close()
        for member in self.members:
            stop(member.proc, signal.SIGTERM, timeout=15)  # Patroni stops its postmaster first
            member.proc = None
            self._stop_postmaster(member)
        self.stop_dcs()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PatroniShard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chown(self, *paths: Path) -> None:
        if self.user is None:
            return
        entry = pwd.getpwnam(self.user)
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start_dcs(self, timeout: float = 60.0) -> None:
        """Start (or restart on its data) the cluster's etcd."""
        client, peer = self.etcd_ports
        log = self.workdir / "etcd.log"
        self.etcd_proc = spawn(
            etcd_command(
                binaries_dir(), self.workdir / "etcd", f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
            ),
            log,
        )
        wait_for_port(client, timeout, self.etcd_proc, log)

    def stop_dcs(self) -> None:
        """Stop etcd: Patroni's leader cannot renew its key (tests of a lost DCS)."""
        stop(self.etcd_proc, signal.SIGKILL)
        self.etcd_proc = None

    def _configure(self, member: Member) -> None:
        member.workdir.mkdir()
        member.socket_dir.mkdir()
        member.log_file.touch()
        files = shard_ca().issue_server(f"patroni-{self.scope}-{member.name}", ("localhost",), (PRIMARY_HOST,))
        cert, key = member.workdir / "server.crt", member.workdir / "server.key"
        shutil.move(files.cert_file, cert)
        shutil.move(files.key_file, key)
        key.chmod(0o600)
        config: dict[str, Any] = {
            "scope": self.scope,
            "namespace": "/dbprovider/",
            "name": member.name,
            "restapi": {"listen": f"127.0.0.1:{member.api_port}", "connect_address": f"127.0.0.1:{member.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_ports[0]}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "postgresql": {
                        "use_pg_rewind": False,
                        "parameters": {
                            "max_connections": self.max_connections,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "64MB",
                            "hot_standby": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.workdir / "data"),
                "bin_dir": str(self.bin_dir),
                "pgpass": str(member.workdir / "pgpass"),
                # A replica's base backup starts at once instead of after a spread checkpoint.
                "basebackup": [{"checkpoint": "fast"}],
                "authentication": {
                    "superuser": {"username": self.SUPERUSER, "password": self.superuser_password},
                    "replication": {"username": "replicator", "password": self.replication_password},
                },
                "parameters": {
                    "unix_socket_directories": str(member.socket_dir),
                    "ssl": "on",
                    "ssl_cert_file": str(cert),
                    "ssl_key_file": str(key),
                    "password_encryption": "scram-sha-256",
                    "fsync": "off",  # a process kill keeps the page cache: nothing acknowledged is lost
                    "shared_buffers": "32MB",
                    "log_min_messages": "warning",
                },
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 scram-sha-256",
                    f"hostssl all {POOLER_AUTH_USER} 127.0.0.1/32 scram-sha-256",
                    f"host all {POOLER_AUTH_USER} 127.0.0.1/32 reject",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
        }
        member.config_file.write_text(yaml.safe_dump(config))
        member.config_file.chmod(0o600)
        self._chown(member.workdir, member.socket_dir, member.log_file, cert, key, member.config_file)

    def _launch(self, member: Member) -> None:
        env = {
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            # The walreceiver's libpq: the build's own (its RUNPATH names a directory that does not exist
            # here, and the system's older libpq refuses the sslnegotiation option Patroni sets for 17+).
            "LD_LIBRARY_PATH": str(self.bin_dir.parent / "lib"),
            "HOME": str(member.workdir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith("-packages")),
        }
        argv = [_interpreter(self.user), "-S", "-m", "patroni", str(member.config_file)]
        member.proc = spawn(argv, member.log_file, user=self.user, env=env)

    def _stop_postmaster(self, member: Member) -> None:
        """An immediate shutdown of a postmaster that outlived its Patroni (Patroni was killed)."""
        pid = _postmaster_pid(member)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)

    # -- state ---------------------------------------------------------------------------------

    def leader(self) -> Member | None:
        """The member whose REST API says it is the running primary."""
        return next((m for m in self.members if m.proc is not None and m.api("/primary") == 200), None)

    def wait_leader(self, timeout: float = 90.0, other_than: Member | None = None) -> Member:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for member in self.members:
                if member.proc is not None and member.proc.poll() is not None:
                    raise RuntimeError(f"patroni {member.name} exited{_tail(member.log_file)}")
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader
            time.sleep(0.2)
        raise TimeoutError(f"no Patroni leader within {timeout:.0f}s{_tail(self.members[0].log_file)}")

    def wait_streaming(self, count: int, timeout: float = 90.0) -> None:
        """Wait until `count` replicas stream from the primary."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                rows = self.query(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND application_name = ANY(%s)",
                    ([m.name for m in self.members],),
                )
                if rows[0][0] >= count:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"{count} replicas did not stream within {timeout:.0f}s; see {self.workdir}")

    def _prepare(self) -> None:
        """The provisioner, docs/sql.md's shard preparation, and the pooler's role and function in
        every database that allows connections (template1 included), as Percona's operator does."""
        with self.superuser_connection() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN CREATEDB CREATEROLE"
                    + (" NOINHERIT" if self.major < 16 else "")
                    + " PASSWORD {}"
                ).format(sql.Identifier(self.PROVISIONER), sql.Literal(self.provisioner_password))
            )
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(POOLER_AUTH_USER), sql.Literal(self.pooler_password)
                )
            )
            conn.execute(
                sql.SQL("ALTER ROLE {} SET search_path TO {}").format(
                    sql.Identifier(POOLER_AUTH_USER), sql.Identifier(POOLER_SCHEMA)
                )
            )
            conn.execute(documented_setup())  # what docs/install.md asks of a shard behind pgBouncer
            conn.execute("REVOKE CONNECT ON DATABASE template1 FROM PUBLIC")
            conn.execute("REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE postgres TO {}").format(sql.Identifier(self.PROVISIONER)))
        for database in ("postgres", "template1"):
            with self.superuser_connection(database) as conn:
                if self.major < 15:
                    conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
                conn.execute(auth_function_sql())

    # -- access --------------------------------------------------------------------------------

    @property
    def major(self) -> int:
        return self.flavor.major

    @property
    def port(self) -> int:
        """The primary endpoint: what the Shard's admin endpoint points at."""
        return self.primary.port

    @property
    def client_port(self) -> int:
        """pgBouncer: what the Shard's client endpoint points at."""
        assert self.pgbouncer is not None
        return self.pgbouncer.port

    def superuser_connection(self, dbname: str = "postgres") -> psycopg.Connection:
        """A superuser session on the current primary, over its Unix socket."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("the Patroni cluster has no primary")
        return leader.superuser_connection(dbname)

    def query(self, statement: Any, params: Any = None, *, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        with self.superuser_connection(dbname) as conn:
            return conn.execute(statement, params).fetchall()

    def timeline(self, timeout: float = 60.0) -> int:
        """The current primary's timeline (a promotion starts a new one), once it is out of recovery:
        Patroni names a new leader while its promotion is still under way."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = self.query("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
                return int(rows[0][0], 16)
            except psycopg.errors.ObjectNotInPrerequisiteState:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def connect(self, user: str, password: str, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection:
        """A password login through pgBouncer (TLS required there), as a consumer connects."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.client_port,
            user=user,
            password=password,
            dbname=dbname,
            sslmode="require",
            connect_timeout=10,
            **kwargs,
        )

    def pgbouncer_admin(self, command: str) -> str:
        """One command on pgBouncer's admin console (`PAUSE`, `RESUME`, `SHOW POOLS`)."""
        assert self.pgbouncer is not None
        return self.pgbouncer.admin(command, self.bin_dir / "psql")

    def patronictl(self, *args: str) -> str:
        """`patronictl <args>` against this cluster (e.g. `switchover --force`); its output."""
        patronictl = Path(sys.executable).parent / "patronictl"
        result = subprocess.run(
            [str(patronictl), "-c", str(self.members[0].config_file), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"patronictl {' '.join(args)} failed: {result.stdout}{result.stderr}")
        return result.stdout

    def switchover(self) -> Member:
        """`patronictl switchover --force` from the leader to another member; the new leader."""
        old = self.wait_leader()
        candidate = next(m for m in self.members if m is not old and m.proc is not None)
        out = self.patronictl("switchover", self.scope, "--leader", old.name, "--candidate", candidate.name, "--force")
        if "Successfully switched over" not in out:
            raise RuntimeError(f"patronictl switchover did not switch over: {out}")
        return self.wait_leader(other_than=old)

    def kill_leader(self) -> Member:
        """SIGKILL the leader's Patroni and its postmaster (a lost node); the member killed. A replica
        takes over once the leader key expires in the DCS (within about TTL + LOOP_WAIT seconds)."""
        leader = self.wait_leader()
        stop(leader.proc, signal.SIGKILL)
        leader.proc = None
        pid = _postmaster_pid(leader)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # its backends follow (postmaster death)
        return leader

    def rejoin_killed(self, timeout: float = 120.0) -> None:
        """Bring every killed member back as a fresh replica (its data directory removed: without
        pg_rewind a primary that was killed may have diverged from the new timeline), and wait until
        all replicas stream."""
        for member in self.members:
            if member.proc is None:
                shutil.rmtree(member.workdir / "data", ignore_errors=True)
                self._launch(member)
        self.wait_streaming(len(self.members) - 1, timeout)

    @contextlib.contextmanager
    def paused_pgbouncer(self) -> Iterator[None]:
        self.pgbouncer_admin("PAUSE")
        try:
            yield
        finally:
            self.pgbouncer_admin("RESUME")
