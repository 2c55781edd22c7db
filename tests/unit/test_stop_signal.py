"""SIGTERM stops the manager and `dbprovider dev` even when the kernel hands it to another thread.

The process runs many threads; Python runs handlers in the main thread only. The script below sends
SIGTERM to a worker thread, as the kernel may, while the main thread waits to be stopped.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading, time
    from dbprovider.manager import wait_for_stop
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    def deliver():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # taken by this thread, not main
    threading.Thread(target=deliver, daemon=True).start()
    if sys.argv[1] == "plain":
        stop.wait()
    else:
        wait_for_stop(stop)
    print("stopped")
    """
)


def _run(mode: str, timeout: float) -> str | None:
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout


def test_a_signal_taken_by_another_thread_stops_the_wait() -> None:
    assert _run("poll", 10) == "stopped\n"


def test_a_plain_wait_misses_it() -> None:
    """The hazard is real: without the periodic wake-up the main thread sleeps on."""
    assert _run("plain", 3) is None
