"""Waiting for hack/late-builds.sh's background builds: as long as its runner works on them, no longer.

tests/conftest.py waits with this before pytest-timeout's clock starts: a cold build of the Pulumi
tools takes longer than one test's 600 s timeout.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from harness.process import wait_for_background_builds


def _runner(state: Path) -> subprocess.Popen[str]:
    """A stand-in for the background runner: takes runner.lock, says so, builds until told to finish (a line
    on its stdin), then marks the build ok and exits."""
    script = f"exec 9>{state}/runner.lock; flock 9; echo locked; read -r _; echo ok > {state}/pulumi.status"
    return subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_waits_while_the_runner_builds_and_returns_when_it_is_done(tmp_path: Path) -> None:
    (tmp_path / "pulumi.status").write_text("running\n")
    runner = _runner(tmp_path)
    assert runner.stdin is not None and runner.stdout is not None
    assert runner.stdout.readline() == "locked\n"
    done = threading.Event()
    waiter = threading.Thread(
        target=lambda: (wait_for_background_builds(["pulumi"], state=tmp_path, poll=0.05), done.set())
    )
    waiter.start()
    assert not done.wait(0.5)  # ten polls: still waiting while the runner builds
    runner.stdin.write("finish\n")
    runner.stdin.close()
    assert runner.wait(10) == 0
    assert done.wait(5)
    assert (tmp_path / "pulumi.status").read_text().strip() == "ok"


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
