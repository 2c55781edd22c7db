"""A TCP proxy on loopback that can make a link slow, flaky or silent (fault tests).

`TcpProxy(host, port).start()` listens on a free 127.0.0.1 port and forwards every connection to
host:port, byte for byte (TLS passes through untouched). While it runs, a test can:

- `set_latency(seconds)`: add that much round-trip time (half on the way there, half on the way
  back) to every chunk, keeping the order, as a link to a shard in another region would;
- `set_resets(every)`: reset (RST, as a broken middlebox does) one open connection about every
  `every` seconds (0.5 to 1.5 times it), the longest-open first; `None` stops that;
- `blackhole()`: forward nothing any more, in either direction, and connect new clients nowhere
  (their connection opens and then hears nothing), as a partition looks to the application;
  `heal()` forwards again (what was held is delivered, as TCP retransmission would);
- `reset_all()`: reset every open connection now;
- `retarget(target)`: send new connections to another host:port, or (None) close them at once, as a
  Service without endpoints does; open connections are reset (a load balancer following a leader).

It is a userspace proxy: its own kernel acknowledges what the client sends, so a client's TCP
keepalives and tcp_user_timeout see a healthy peer. What it emulates is what the application sees
(no answer, slow answers, resets), not what the client's kernel sees.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from harness.sockets import accepted

_CHUNK = 65536


@dataclass
class _Direction:
    """One direction of one connection: chunks read, each due at its arrival time plus the delay."""

    source: socket.socket
    sink: socket.socket
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=threading.Condition)
    eof: bool = False


class _Link:
    """A client connection and its upstream connection, pumped by four threads."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket | None) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.opened = time.monotonic()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._finished = 0  # directions that passed their EOF on

    def start(self) -> None:
        if self.upstream is None:
            return  # a blackholed connection: held open, never connected anywhere
        for source, sink in ((self.client, self.upstream), (self.upstream, self.client)):
            direction = _Direction(source, sink)
            threading.Thread(target=self._read, args=(direction,), daemon=True).start()
            threading.Thread(target=self._write, args=(direction,), daemon=True).start()

    def _read(self, direction: _Direction) -> None:
        try:
            while not self.closed.is_set():
                data = direction.source.recv(_CHUNK)
                with direction.cond:
                    if not data:
                        direction.eof = True
                    else:
                        direction.queue.append((time.monotonic() + self.proxy.latency / 2, data))
                    direction.cond.notify_all()
                if not data:
                    return
        except OSError:
            self.close(reset=True)

    def _write(self, direction: _Direction) -> None:
        try:
            while True:
                data = self._next(direction)
                if data is None:
                    break
                direction.sink.sendall(data)
        except OSError:
            self.close(reset=True)
            return
        with contextlib.suppress(OSError):
            direction.sink.shutdown(socket.SHUT_WR)  # pass the EOF on
        with self._lock:
            self._finished += 1
            both = self._finished == 2
        if both:
            self.close()

    def _next(self, direction: _Direction) -> bytes | None:
        """The next chunk once it is due (and the link is not silent); None at EOF or close."""
        with direction.cond:
            while not self.closed.is_set():
                if not self.proxy.silent and direction.queue:
                    due, data = direction.queue[0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        direction.queue.popleft()
                        return data
                    direction.cond.wait(wait)
                elif not self.proxy.silent and direction.eof:
                    return None
                else:
                    direction.cond.wait(0.05)
        return None

    def close(self, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if reset:  # SO_LINGER 0: close() sends a RST instead of a FIN
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)


class TcpProxy:
    """See the module docstring. `close()` (or the context manager) stops it and every connection."""

    def __init__(self, target_host: str, target_port: int, *, connect_timeout: float = 5.0) -> None:
        self.target: tuple[str, int] | None = (target_host, target_port)
        self.connect_timeout = connect_timeout
        self.latency = 0.0  # added round-trip seconds
        self.silent = False
        self.resets = 0  # connections reset by set_resets (observability for tests)
        self._reset_every: float | None = None
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]

    def start(self) -> TcpProxy:
        self._listener.listen(128)
        threading.Thread(target=self._accept, name=f"tcp-proxy-{self.port}", daemon=True).start()
        threading.Thread(target=self._resetter, name=f"tcp-proxy-{self.port}-resets", daemon=True).start()
        return self

    # -- faults ----------------------------------------------------------------------------------

    def set_latency(self, round_trip: float) -> None:
        self.latency = max(0.0, round_trip)

    def set_resets(self, every: float | None) -> None:
        self._reset_every = every

    def blackhole(self) -> None:
        self.silent = True

    def heal(self) -> None:
        self.silent = False

    def reset_all(self) -> None:
        for link in self.links():
            link.close(reset=True)

    def retarget(self, target: tuple[str, int] | None) -> None:
        self.target = target
        self.reset_all()

    def links(self) -> list[_Link]:
        with self._lock:
            return list(self._links)

    # -- machinery -------------------------------------------------------------------------------

    def _accept(self) -> None:
        for client in accepted(self._listener, self._stop):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = None
            target = self.target
            if target is None:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            if not self.silent:
                try:
                    upstream = socket.create_connection(target, timeout=self.connect_timeout)
                    upstream.settimeout(None)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    with contextlib.suppress(OSError):
                        client.close()
                    continue
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.append(link)
            link.start()

    def _resetter(self) -> None:
        while not self._stop.is_set():
            every = self._reset_every
            if every is None:
                self._stop.wait(0.1)
                continue
            self._stop.wait(every * random.uniform(0.5, 1.5))
            if self._reset_every is None:
                continue
            links = sorted(self.links(), key=lambda link: link.opened)
            if links:
                self.resets += 1
                links[0].close(reset=True)

    def _forget(self, link: _Link) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self.links():
            link.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
