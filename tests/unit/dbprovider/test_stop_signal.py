"""SIGTERM stops the manager and `dbprovider dev` even when the kernel hands it to another thread.

The process runs many threads; Python runs handlers in the main thread only. The script below sends
SIGTERM to a worker thread, as the kernel may, while the main thread waits to be stopped, and says so
once the signal is delivered.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dbprovider.manager import STOP_POLL

SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading, time
    if sys.argv[1] == "poll":
        from dbprovider.manager import wait_for_stop
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    def deliver():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # taken by this thread, not main
        print("delivered", flush=True)
    threading.Thread(target=deliver, daemon=True).start()
    if sys.argv[1] == "plain":
        stop.wait()
    else:
        wait_for_stop(stop)
    print("stopped", flush=True)
    """
)
# How long after the delivery a wait that missed the signal must still be waiting: three of wait_for_stop's
# wake-ups, each of which would have run the handler.
MISSED_AFTER = 3 * STOP_POLL


def test_a_signal_taken_by_another_thread_stops_the_wait() -> None:
    # The deadline covers importing the manager, which alone can take seconds on a loaded machine.
    done = subprocess.run([sys.executable, "-c", SCRIPT, "poll"], capture_output=True, text=True, timeout=60)
    assert sorted(done.stdout.splitlines()) == ["delivered", "stopped"]


def test_a_plain_wait_misses_it() -> None:
    """The hazard is real: without the periodic wake-up the main thread sleeps on after the signal came."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "plain"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "delivered\n"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=MISSED_AFTER)
    finally:
        proc.kill()
        proc.wait()
