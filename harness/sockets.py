"""Accept loops for the harness's loopback servers (proxies, relays, hostile servers).

Every such server runs a thread that accepts until it is told to stop, and each spelled out the same
loop: accept, skip a listener timeout (the chance to look at the stop flag), end when the listener is
closed. `accepted()` is that loop, once.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator


def accepted(listener: socket.socket, stop: threading.Event | None = None) -> Iterator[socket.socket]:
    """Each connection `listener` accepts, until `stop` is set or the listener is closed.

    Without a timeout on the listener, only closing it ends the loop; with one, `stop` is looked at
    that often (a timeout is not an error here)."""
    while stop is None or not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return  # closed
        yield conn
