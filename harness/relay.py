"""A man in the middle for a real PostgreSQL server, on loopback: what a Shard's host could point at.

    with PostgresRelay(server.port) as relay:                       # passes the bytes through
    with PostgresRelay(server.port, terminate_tls=cert_files) as relay:   # its own TLS, both sides

Without `terminate_tls` it copies bytes both ways: TLS, when the client asks for it, runs end to end
between client and server and the relay sees ciphertext only. With `terminate_tls` it answers the
client's SSLRequest itself with that certificate, opens its own connection to the server (over TLS
unless `upstream_tls=False`) and forwards the decrypted protocol, as an attacker holding the
network path would. Wherever it can read the server's messages it records each AuthenticationOk it
forwards (`authenticated`): a session the relay could take over, since nothing ties the
authenticated connection to the client any more.

With `hijack` (and `terminate_tls`) it also acts on the next session it relays: once the server has
authenticated the client, it runs those statements on that session before the client's first query
(their answers are not forwarded; `hijack` is then None), and it keeps every session open when the
client leaves, as an attacker holding the path would, to use it later.

`connections` counts the TCP connections clients opened to it; `client_bytes` is what clients
sent, as the relay saw it (ciphertext in a TLS pass-through).
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import threading
from pathlib import Path

from harness.certs import CertFiles

SSL_REQUEST = struct.pack("!II", 8, 80877103)
_GSSENC_REQUEST_CODE = 80877104


class PostgresRelay:
    """Relays 127.0.0.1:`port` to 127.0.0.1:`target_port` until closed (an event loop in a thread)."""

    def __init__(
        self,
        target_port: int,
        *,
        terminate_tls: CertFiles | None = None,
        upstream_tls: bool = True,
        hijack: list[str] | None = None,
    ) -> None:
        self.target_port = target_port
        self.terminate_tls = terminate_tls
        self.upstream_tls = upstream_tls
        self.hijack = hijack
        self.port = 0
        self.connections = 0
        self.authenticated = 0
        self.client_bytes = bytearray()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # both ends of every relayed connection
        self._thread = threading.Thread(target=self._run, name="postgres-relay", daemon=True)

    def __enter__(self) -> PostgresRelay:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the event loop --------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            # Every socket closed before the loop is: a server backend left waiting for a startup
            # packet holds up DROP DATABASE (its barrier) until authentication_timeout.
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            for w in self._writers:
                w.transport.abort()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        try:
            if self.terminate_tls is None:
                await asyncio.gather(self._pump(reader, up_writer, record=True), self._pump(up_reader, writer))
            else:
                await self._terminate(reader, writer, up_reader, up_writer)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, ConnectionError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bool = False) -> None:
        while data := await reader.read(65536):
            if record:
                with self._lock:
                    self.client_bytes += data
            writer.write(data)
            await writer.drain()
        writer.close()

    async def _terminate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """TLS of its own towards the client (when asked for), its own connection to the server."""
        assert self.terminate_tls is not None
        first = await reader.readexactly(8)
        while struct.unpack("!II", first)[1] == _GSSENC_REQUEST_CODE:
            writer.write(b"N")
            await writer.drain()
            first = await reader.readexactly(8)
        if first == SSL_REQUEST:
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(_server_context(self.terminate_tls.cert_file, self.terminate_tls.key_file))
            first = b""
        if self.upstream_tls:
            up_writer.write(SSL_REQUEST)
            await up_writer.drain()
            if await up_reader.readexactly(1) != b"S":
                return
            client_side = ssl.create_default_context()
            client_side.check_hostname = False
            client_side.verify_mode = ssl.CERT_NONE
            await up_writer.start_tls(client_side)
        if first:
            up_writer.write(first)
        session = _Session()
        if self.hijack is not None and not first:
            client = self._hijacking(reader, up_writer, session)
        else:
            client = self._pump(reader, up_writer, record=True)
        await asyncio.gather(client, self._watch(up_reader, writer, session))

    async def _watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: _Session) -> None:
        """Forward the server's messages, counting each AuthenticationOk ('R', length 8, code 0); the
        answers to the relay's own statements, and anything after the client left, stay with the relay."""
        while True:
            head = await reader.readexactly(5)
            kind, length = head[:1], struct.unpack("!I", head[1:])[0]
            body = await reader.readexactly(length - 4)
            if kind == b"R" and length == 8 and body == b"\0\0\0\0":
                session.authenticated = True
                with self._lock:
                    self.authenticated += 1
            if session.swallow:
                session.swallow -= kind == b"Z"  # ReadyForQuery ends the answer to one statement
                continue
            if session.client_gone:
                continue
            try:
                writer.write(head + body)
                await writer.drain()
            except (OSError, ConnectionError):
                session.client_gone = True

    async def _hijacking(
        self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, session: _Session
    ) -> None:
        """The client's messages to the server, the `hijack` statements (if still there) before the
        client's first one after authentication, and the session kept open when the client leaves."""
        injected = False
        head = await reader.readexactly(4)  # the startup packet: a length, no type
        up_writer.write(head + await reader.readexactly(struct.unpack("!I", head)[0] - 4))
        await up_writer.drain()
        while True:
            try:
                head = await reader.readexactly(5)
                body = await reader.readexactly(struct.unpack("!I", head[1:])[0] - 4)
            except (asyncio.IncompleteReadError, OSError, ssl.SSLError):
                break
            if head[:1] == b"X":
                break
            if session.authenticated and not injected:
                injected = True
                with self._lock:
                    statements, self.hijack = self.hijack or [], None
                session.swallow = len(statements)
                for statement in statements:
                    payload = statement.encode() + b"\0"
                    up_writer.write(b"Q" + struct.pack("!I", len(payload) + 4) + payload)
            up_writer.write(head + body)
            await up_writer.drain()
        session.client_gone = True
        await asyncio.Event().wait()  # hold the server's session until the relay closes


class _Session:
    """What the relay knows about one relayed connection."""

    def __init__(self) -> None:
        self.authenticated = False
        self.swallow = 0  # ReadyForQuery messages still to come for the relay's own statements
        self.client_gone = False


def _server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context
