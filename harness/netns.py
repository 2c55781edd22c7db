"""TCP between this host's loopback and a network namespace the harness made (the one-node Kubernetes').

A socket belongs to the network namespace of the thread that created it, wherever it is used later.
`NetworkNamespace` keeps one thread that entered the namespace (setns; Python 3.11 has no os.setns)
and creates sockets there on request. On top of it, `Relay` pipes connections between the two sides:

    ns = NetworkNamespace("/proc/<pid>/ns/net")
    inward = forward_in(ns, "10.0.0.17", 443)     # host 127.0.0.1:inward.port -> 10.0.0.17:443 inside
    outward = forward_out(ns, "10.22.0.1", 5432)  # 10.22.0.1:outward.port inside -> host 127.0.0.1:5432

Nothing is routed between the namespaces and the host's interfaces, addresses and firewall stay as
they were: only processes of this run can carry bytes across, and only to loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from harness.sockets import accepted

Socket = socket.socket  # the type, named apart from NetworkNamespace.socket

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
T = TypeVar("T")


class NetworkNamespace:
    """A thread inside the namespace of `path` (e.g. /proc/<pid>/ns/net) that makes sockets there."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._calls: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        entered: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(entered,), name="netns", daemon=True)
        self._thread.start()
        entered.result(10)

    def _run(self, entered: Future[None]) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                entered.set_exception(OSError(errno, f"setns({self.path}): {os.strerror(errno)}"))
                return
        finally:
            os.close(fd)
        entered.set_result(None)
        while (call := self._calls.get()) is not None:
            fn, result = call
            try:
                result.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result.set_exception(exc)

    def run(self, fn: Callable[[], T]) -> T:
        """Call `fn` on the thread inside the namespace (for socket creation; keep it short)."""
        result: Future[T] = Future()
        self._calls.put((fn, result))
        return result.result(30)

    def socket(self, family: int = socket.AF_INET) -> Socket:
        """A TCP socket in the namespace."""
        return self.run(lambda: socket.socket(family, socket.SOCK_STREAM))

    def connect(self, host: str, port: int, timeout: float = 5.0) -> Socket:
        """A TCP connection from inside the namespace to host:port (an IP address)."""
        sock = self.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return sock

    def listen(self, host: str, port: int = 0) -> Socket:
        """A listening TCP socket inside the namespace (port 0: the kernel picks one)."""
        sock = self.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        return sock

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(5)


class Relay:
    """Accepts on `listener` and pipes each connection to a new one from `dial()`, both ways, with
    half-close (EOF on one side shuts down writing on the other) so protocols that end with it work."""

    def __init__(self, listener: socket.socket, dial: Callable[[], socket.socket], name: str) -> None:
        self.listener = listener
        self.host, self.port = listener.getsockname()[:2]
        self._dial = dial
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"relay-{name}", daemon=True).start()

    def _accept(self) -> None:
        for client in accepted(self.listener):
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = self._dial()
        except OSError:
            client.close()  # the caller sees a closed connection, as with nothing listening
            return
        with self._lock:
            if self._closed:
                client.close()
                upstream.close()
                return
            self._open.update((client, upstream))
        pumps = [2]
        lock = threading.Lock()

        def finished(broken: bool) -> None:
            with lock:
                pumps[0] -= 1
                last = pumps[0] == 0
            if broken or last:
                self._forget(client, upstream)

        threading.Thread(target=self._pipe, args=(upstream, client, finished), daemon=True).start()
        self._pipe(client, upstream, finished)

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket, finished: Callable[[bool], None]) -> None:
        """Copy until EOF, then pass the EOF on (half-close); on an error cut both sides."""
        try:
            while data := source.recv(65536):
                target.sendall(data)
            target.shutdown(socket.SHUT_WR)
        except OSError:
            finished(True)
            return
        finished(False)

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a pump blocked in recv (close alone does not)
            sock.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            open_sockets = list(self._open)
        self._forget(*open_sockets)


def forward_in(ns: NetworkNamespace, host: str, port: int) -> Relay:
    """127.0.0.1:<relay.port> on this host -> host:port inside the namespace."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    return Relay(listener, lambda: ns.connect(host, port), f"in-{host}:{port}")


def forward_out(ns: NetworkNamespace, bind_host: str, local_port: int) -> Relay:
    """bind_host:<relay.port> inside the namespace -> 127.0.0.1:local_port on this host."""
    listener = ns.listen(bind_host)
    return Relay(listener, lambda: socket.create_connection(("127.0.0.1", local_port), timeout=5), f"out-{local_port}")
