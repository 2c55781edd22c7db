"""A shard whose disk is full is not Ready (DiskFull), gets no placements, and its work waits.

A real PostgreSQL 18 with its data directory on a small tmpfs (the WAL elsewhere, as on a server
with a separate WAL volume), filled up by a ballast file: CREATE DATABASE fails with disk_full
(53100) as it would on a real shard. The test mounts the tmpfs itself, so it needs root with
CAP_SYS_ADMIN, as the harness' other servers need root (they run as the `postgres` OS user).
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.resources import SHARDS
from harness import PostgresServer
from tests.reconciler.causes import wait_reason
from tests.reconciler.conftest import Fleet
from tests.support.common import condition
from tests.support.postgres import PostgresPool


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 64 MB tmpfs owned by the server's OS user."""
    mount = Path(tempfile.mkdtemp(prefix="dbprovider-small-disk-", dir="/var/tmp"))
    mount.chmod(0o755)
    owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    options = f"size=64m,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}"
    command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)]
    mounted = subprocess.run(command, capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root with CAP_SYS_ADMIN: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


@pytest.fixture
def full_server(small_disk: Path) -> Iterator[PostgresServer]:
    with PostgresServer("18", data_dir=small_disk / "data") as server:
        yield server


def fill(disk: Path) -> Path:
    """Write a ballast file until the filesystem refuses (ENOSPC); its path."""
    ballast = disk / "ballast"
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb") as out:
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return ballast


@pytest.fixture
def pg18(postgres_pool: PostgresPool) -> PostgresServer:
    return postgres_pool.get("18")


def test_a_full_disk_makes_the_shard_disk_full_until_space_is_freed(
    full_server: PostgresServer, small_disk: Path, pg18: PostgresServer, fleet: Fleet, start_manager, admin_rest
) -> None:
    shard = fleet.shard(full_server)
    other = fleet.shard(pg18, accepting=False)
    manager = start_manager()
    fleet.wait_shard(shard, "Ok")
    ballast = fill(small_disk)

    # The first write that needs space fails with disk_full: the Shard says DiskFull, the database waits.
    name = fleet.database("full-1")
    ready = condition(fleet.wait_shard(shard, "DiskFull", timeout=60), "Ready")
    assert ready["status"] == "False" and "disk_full" in ready["message"]
    db = wait_reason(fleet, name, "ShardNotReady", timeout=30)
    assert db["status"]["phase"] == "Provisioning" and db["status"]["shard"] == shard
    assert manager.errors("database", "EnsureFailed") >= 1  # the write that found it out

    # No placements on it: a new database goes to the other shard.
    admin_rest.patch(SHARDS, other, {"spec": {"accepting": True}})
    elsewhere = fleet.database("full-2")
    assert fleet.wait_phase(elsewhere, "Ready")["status"]["shard"] == other
    assert condition(fleet.get_shard(shard), "Ready")["reason"] == "DiskFull"  # still: a write still fails

    ballast.unlink()  # space is freed: the next check's test write passes
    fleet.wait_shard(shard, "Ok", timeout=30)
    assert fleet.wait_phase(name, "Ready", timeout=60)["status"]["shard"] == shard
