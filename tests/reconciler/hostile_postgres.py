"""A phishing "PostgreSQL" on loopback: it speaks just enough of the protocol to ask for a password.

It answers SSL and GSS encryption requests with 'N', reads the startup packet, asks for the password
in cleartext (AuthenticationCleartextPassword, code 3) or as md5 (code 5), and records everything the
client sends afterwards, until the client hangs up. A client that answers sends a PasswordMessage
('p' followed by the password or its md5 hash).
"""

from __future__ import annotations

import socket
import struct
import threading

from harness.sockets import accepted

CLEARTEXT = 3
MD5 = 5
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_PROTOCOL_3 = 196608


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client closed")
        data += chunk
    return data


class HostilePostgres:
    """Accepts connections on 127.0.0.1:`port` until `close()`; one thread per connection."""

    def __init__(self, auth_code: int) -> None:
        self.auth_code = auth_code
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self.connections = 0  # TCP connections accepted
        self.startups: list[dict[str, str]] = []  # startup parameters (user, database, ...) seen
        self.replies: list[bytes] = []  # what each client sent after the password request
        self.hung_up = threading.Event()  # a client closed its connection after the request
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="hostile-postgres", daemon=True)
        self._thread.start()

    def __enter__(self) -> HostilePostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()

    def _accept(self) -> None:
        for conn in accepted(self._server, self._stop):
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(15)
        with conn:
            try:
                params = self._startup(conn)
            except (ConnectionError, OSError):
                return
            with self._lock:
                self.startups.append(params)
            request = struct.pack("!I", self.auth_code)
            if self.auth_code == MD5:
                request += b"salt"
            conn.sendall(b"R" + struct.pack("!I", 4 + len(request)) + request)
            received = b""
            try:
                while chunk := conn.recv(4096):
                    received += chunk
            except OSError:
                pass  # a timeout: the client neither answered nor hung up
            else:
                self.hung_up.set()
            with self._lock:
                self.replies.append(received)

    @staticmethod
    def _startup(conn: socket.socket) -> dict[str, str]:
        """Refuse encryption requests until the real startup packet arrives; its parameters."""
        while True:
            (length,) = struct.unpack("!I", _read_exactly(conn, 4))
            body = _read_exactly(conn, length - 4)
            (code,) = struct.unpack("!I", body[:4])
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                conn.sendall(b"N")
                continue
            if code != _PROTOCOL_3:
                raise ConnectionError("not a protocol 3 startup packet")
            fields = body[4:].split(b"\0")
            return {k.decode(): v.decode() for k, v in zip(fields[0::2], fields[1::2], strict=False) if k}
