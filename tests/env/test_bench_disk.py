"""bench.provisioning keeps every database it creates until it ends (1,600 by default, about 14 GB): on a disk
without that room it must refuse at once, saying how much it needs and where, not fail minutes in with
disk_full on every create."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import provisioning
from bench.common import REPO


def test_a_run_the_disk_cannot_hold_is_refused_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.provisioning", "--count", "1000000"],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"keeps its 8000000 databases until it ends: it needs about 60002.0 GB free in {tmp_path}" in result.stderr
    assert "starting kube-apiserver" not in result.stderr  # refused before the stack
    assert not list(tmp_path.iterdir())  # no server was made


def test_the_need_is_the_databases_and_the_wal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 databases and the WAL's room fit in exactly that much free space, and not in a byte less."""
    needed = 200 * provisioning.DATABASE_BYTES + provisioning.WAL_BYTES
    for free, fits in ((needed, True), (needed - 1, False)):
        usage = shutil.disk_usage(tmp_path)._replace(free=free)
        monkeypatch.setattr(provisioning.shutil, "disk_usage", lambda path, usage=usage: usage)
        if fits:
            provisioning.check_disk(200, str(tmp_path))
        else:
            with pytest.raises(SystemExit, match="it needs about 3.5 GB free"):
                provisioning.check_disk(200, str(tmp_path))
