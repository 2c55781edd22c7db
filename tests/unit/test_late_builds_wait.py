"""Waiting for hack/late-builds.sh's background builds: as long as its runner works on them, no longer.

A cold CI run once failed every tests/pulumi test because the wait ran inside pytest-timeout's 600 s
clock while the Pulumi build took 28 min; tests/conftest.py now waits with this before the clock starts.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from harness.process import wait_for_background_builds


def _runner(state: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A stand-in for the background runner: holds runner.lock, then marks the build ok and exits."""
    script = f"exec 9>{state}/runner.lock; flock 9; sleep {seconds}; echo ok > {state}/pulumi.status"
    return subprocess.Popen(["bash", "-c", script])


def test_waits_while_the_runner_builds_and_returns_when_it_is_done(tmp_path: Path) -> None:
    (tmp_path / "pulumi.status").write_text("running\n")
    runner = _runner(tmp_path, 1.5)
    time.sleep(0.3)  # the runner has its lock
    started = time.monotonic()
    wait_for_background_builds(["pulumi"], state=tmp_path, poll=0.05)
    waited = time.monotonic() - started
    runner.wait()
    assert (tmp_path / "pulumi.status").read_text().strip() == "ok"
    assert waited > 0.5


def test_a_failed_build_ends_the_wait_at_once(tmp_path: Path) -> None:
    (tmp_path / "pulumi.status").write_text("failed 1\n")
    (tmp_path / "runner.lock").touch()
    done = threading.Event()
    threading.Thread(target=lambda: (wait_for_background_builds(["pulumi"], state=tmp_path), done.set())).start()
    assert done.wait(5)


def test_a_runner_that_is_gone_ends_the_wait(tmp_path: Path) -> None:
    """A `running` status left by a runner that died: the caller's own build call takes over."""
    (tmp_path / "pulumi.status").write_text("running\n")
    (tmp_path / "runner.lock").touch()  # nobody holds it
    done = threading.Event()
    threading.Thread(target=lambda: (wait_for_background_builds(["pulumi"], state=tmp_path), done.set())).start()
    assert done.wait(5)
