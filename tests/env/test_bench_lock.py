"""The machine's benchmark lock (`--lock` of bench.scale and bench.list_pages): a long setup holds it shared, so
another setup runs beside it but a measurement (a `flock` from the shell, as the bench README runs them) waits;
what is measured holds it exclusive, so nothing else takes it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from bench.common import REPO, machine_lock


def taken_now(path: Path, mode: str) -> bool:
    """Whether another process gets `flock -n` on `path` in `mode` ("-s" shared, "-x" exclusive) at once."""
    return subprocess.run(["flock", "-n", mode, str(path), "true"], check=False).returncode == 0


def test_a_setup_lets_other_setups_in_and_keeps_measurements_out(tmp_path: Path) -> None:
    lock = tmp_path / "bench.lock"
    with machine_lock(lock, shared=True):
        assert taken_now(lock, "-s")
        assert not taken_now(lock, "-x")
    assert taken_now(lock, "-x")


def test_a_measurement_keeps_everything_out(tmp_path: Path) -> None:
    lock = tmp_path / "bench.lock"
    with machine_lock(lock):
        assert not taken_now(lock, "-s")
        assert not taken_now(lock, "-x")
    assert taken_now(lock, "-s")


def test_a_setup_killed_midway_leaves_no_lock_behind(tmp_path: Path) -> None:
    """A benchmark killed during its setup (SIGKILL: no finally runs) frees the lock with its open file."""
    lock = tmp_path / "bench.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from bench.common import REPO, machine_lock\n"
            "with machine_lock(Path(sys.argv[1]), shared=True):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        assert not taken_now(lock, "-x")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert taken_now(lock, "-x")
    finally:
        holder.kill()
        holder.wait()
