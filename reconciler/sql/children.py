"""Client tools (pg_dump, pg_restore) started so that they die with the manager.

In a pod the container takes a killed manager's children along; a manager run elsewhere (a VM, a
developer's machine) would leave a copy running against both shards. On Linux each child asks the
kernel for SIGKILL when its parent ends (PR_SET_PDEATHSIG), before it runs the tool; elsewhere
nothing is asked.

The kernel's parent is the *thread* that started the child, not the process: the child is killed
when that thread ends, even with the manager alive. So the thread that starts a tool must wait for
it and never leave it running behind (subprocess.run does; so does move_offline.dump_and_restore).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the parent (the child runs no lookup between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess that makes the child die (SIGKILL) when the calling thread ends,
    which a SIGKILLed manager's threads all do; None where the kernel offers no such request.

    The function runs in the child between fork and exec: it calls only prctl and getppid, takes no
    lock and imports nothing. A parent that ended before the request was made is caught by comparing
    the parent's pid: the child then exits at once instead of running orphaned."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)

    return preexec
