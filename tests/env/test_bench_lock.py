"""The machine's benchmark lock (`--lock` of bench.scale and bench.list_pages): a long setup holds it shared, so
another setup runs beside it but a measurement (a `flock` from the shell, as the bench README runs them) waits;
what is measured holds it exclusive, so nothing else takes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.common import machine_lock


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
