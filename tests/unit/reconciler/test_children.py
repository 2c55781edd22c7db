"""A client tool started with children.die_with_parent by a thread that waits for it (as the move's
copy does) runs while its parent runs, and ends when the parent process is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.common import wait_for

REPO = Path(__file__).resolve().parents[3]
# A parent like the manager: a worker thread starts the tool and waits for it; the main thread idles.
PARENT = textwrap.dedent(
    """
    import subprocess, threading, time
    from reconciler.sql.children import die_with_parent

    def work():
        child = subprocess.Popen(["sleep", "300"], preexec_fn=die_with_parent())
        print(child.pid, flush=True)
        child.wait()

    threading.Thread(target=work, daemon=True).start()
    time.sleep(300)
    """
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def alive(pid: int) -> bool:
    """Whether the process runs (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_the_child_of_a_waiting_thread_lives_with_its_parent_and_dies_with_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child) and parent.poll() is None
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_for(lambda: not alive(child), 30, "the child to end with its parent")
    finally:
        for pid in (parent.pid, child):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait(30)
