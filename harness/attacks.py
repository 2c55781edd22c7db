"""Hostile clients of the API, for its tests and benchmarks, on loopback only.

    with HostileClients(port, silent=8, slow=16, idle=20) as attack:
        ...                      # legitimate requests meanwhile
    attack.opened                # connections opened (each is reopened when the server drops it)

- silent: a TCP connection that never sends a TLS hello;
- slow: a TLS connection that sends its request headers one byte every `byte_every` seconds;
- idle: a TLS connection that completes the handshake and sends nothing;
- chunks: a TLS connection that sends a chunked request body in 1-byte chunks, as fast as it can,
  until the server refuses it (tiny chunks cost the server per chunk).

Bounded: one thread per connection, and every thread stops by itself after `max_seconds` even if the
block is never left. `sources` spreads the connections over loopback source addresses (127.0.0.x),
so a per-address connection cap can be exercised or avoided.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Sequence

SLOW_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Slow: " + b"a" * 4000
CHUNKED_HEAD = b"PUT /v1/databases/chunks HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n"
TINY_CHUNKS = b"1\r\nx\r\n" * 500


class HostileClients:
    """Attackers in threads until the `with` block ends or `max_seconds` pass."""

    def __init__(
        self,
        port: int,
        *,
        silent: int = 0,
        slow: int = 0,
        idle: int = 0,
        chunks: int = 0,
        byte_every: float = 1.0,
        sources: Sequence[str] = ("127.0.0.1",),
        max_seconds: float = 120.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.address = (host, port)
        self.byte_every = byte_every
        self.deadline = time.monotonic() + max_seconds
        self.stopped = threading.Event()
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE
        self._lock = threading.Lock()
        self.opened = 0
        self.dropped = 0
        kinds = ["silent"] * silent + ["slow"] * slow + ["idle"] * idle + ["chunks"] * chunks
        self.threads = [
            threading.Thread(target=self._run, args=(kind, sources[n % len(sources)]), daemon=True)
            for n, kind in enumerate(kinds)
        ]

    def __enter__(self) -> HostileClients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(10)

    def _over(self) -> bool:
        return self.stopped.is_set() or time.monotonic() >= self.deadline

    def _count(self, opened: int = 0, dropped: int = 0) -> None:
        with self._lock:
            self.opened += opened
            self.dropped += dropped

    def _run(self, kind: str, source: str) -> None:
        while not self._over():
            try:
                with socket.create_connection(self.address, timeout=30, source_address=(source, 0)) as raw:
                    self._count(opened=1)
                    if kind == "silent":
                        self._hold(raw)
                    else:
                        with self.context.wrap_socket(raw, server_hostname="api") as tls:
                            {"idle": self._hold, "slow": self._trickle, "chunks": self._chunks}[kind](tls)
            except (OSError, ssl.SSLError):
                pass
            self._count(dropped=1)
            self.stopped.wait(0.1)  # reopen, without spinning on a refusing server

    def _trickle(self, tls: ssl.SSLSocket) -> None:
        for byte in SLOW_REQUEST:
            if self.stopped.wait(self.byte_every) or self._over():
                return
            tls.sendall(bytes([byte]))

    def _chunks(self, tls: ssl.SSLSocket) -> None:
        tls.sendall(CHUNKED_HEAD)
        while not self._over():
            tls.sendall(TINY_CHUNKS)  # raises once the server refused the body and closed

    def _hold(self, sock: socket.socket) -> None:
        """Until the server closes the connection (or the attack ends)."""
        sock.settimeout(2.0)  # few wakeups: 400 idle attackers must not cost the machine they run on
        while not self._over():
            try:
                if sock.recv(1) == b"":
                    return
            except TimeoutError:
                continue
