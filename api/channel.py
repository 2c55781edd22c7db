"""One accepted connection of the front door as a byte channel: TLS through memory BIOs, on the loop.

    channel = Channel(tls_context)                  # or Channel(None): plain TCP (local experiments)
    await loop.connect_accepted_socket(lambda: channel, sock)
    await channel.handshake()
    data = await channel.receive()                  # b"" at the end of the stream
    channel.send(answer); await channel.drain()
    channel.close()                                 # or abort()

Why not asyncio's own TLS (`ssl=` on the transport): its SSL protocol allocates a 256 KiB read
buffer for every connection as it is accepted, so 1,000 idle connections cost about 320 MB. Here the
ciphertext goes through `ssl.MemoryBIO`s and plaintext is decrypted in 16 KiB steps into a buffer that
holds only what the client sent and the parser has not taken yet; OpenSSL releases its own record
buffers while a connection is idle (CPython sets SSL_MODE_RELEASE_BUFFERS). docs/api.md has the
measured cost per connection.
"""

from __future__ import annotations

import asyncio
import ssl

READ_STEP = 16 * 1024  # one TLS record at most
# Stop reading from the socket while this much waits for the parser or the handshake (flow control).
MAX_PENDING = 32 * 1024


class Channel(asyncio.Protocol):
    """A connection's bytes in and out; `None` as context is plain TCP. Loop thread only."""

    def __init__(self, context: ssl.SSLContext | None) -> None:
        self._tls: ssl.SSLObject | None = None
        self._incoming = self._outgoing = None
        if context is not None:
            self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._transport: asyncio.Transport | None = None
        self._plain = bytearray()
        self._eof = False
        self._lost: BaseException | None = None
        self._closed = False
        self._handshaken = context is None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False
        self._ignoring = False

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._tls is None:
            self._plain += data
        else:
            assert self._incoming is not None
            self._incoming.write(data)
            if self._handshaken:
                self._decrypt()
        self._flow()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport: no half-open connections

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._eof = True
        self._lost = exc
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- the channel ---------------------------------------------------------------------------------

    async def handshake(self) -> None:
        """The TLS handshake (nothing for plain TCP); raises ssl.SSLError or ConnectionError."""
        tls = self._tls
        if tls is None or self._handshaken:
            return
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._flow()
                if self._eof:
                    raise ConnectionResetError("closed during the TLS handshake") from None
                await self._wait()
        self._handshaken = True
        self._flush()
        self._decrypt()  # application data that came with the client's Finished

    async def receive(self) -> bytes:
        """The plaintext received so far (waiting for some), b"" once the client closed its side."""
        while not self._plain:
            if self._eof:
                if self._lost is not None:
                    raise ConnectionResetError(str(self._lost))
                return b""
            await self._wait()
        data = bytes(self._plain)
        self._plain.clear()
        self._flow()
        return data

    def send(self, data: bytes) -> None:
        if self._closed or self._transport is None:
            raise ConnectionResetError("connection closed")
        if self._tls is None:
            self._transport.write(data)
            return
        view = memoryview(data)
        while view:
            written = self._tls.write(view)
            view = view[written:]
        self._flush()

    async def drain(self) -> None:
        """Until the transport's write buffer is below its high-water mark."""
        if self._closed:
            raise ConnectionResetError("connection closed")
        if self._writable is not None and not self._writable.done():
            await self._writable
        if self._closed:
            raise ConnectionResetError("connection closed")

    async def wait_closed(self) -> None:
        """Until the transport is closed (after `close()`: once what was sent has been flushed)."""
        while not self._closed:
            await self._wait()

    def close(self) -> None:
        """Send close_notify (TLS) and close once the write buffer is flushed."""
        if self._transport is None or self._closed:
            return
        if self._tls is not None and self._handshaken:
            try:
                self._tls.unwrap()
            except (ssl.SSLError, ValueError):
                pass
            self._flush()
        self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._closed = True

    def ignore_input(self) -> None:
        """Stop reading for good and drop what was received: the client's further bytes wait in the
        kernel (its window closes, so it stops sending) and cost no CPU; `receive()` returns nothing more."""
        self._ignoring = True
        self._plain.clear()
        if self._incoming is not None:
            self._incoming.read()
        if self._transport is not None and not self._closed and not self._paused:
            self._transport.pause_reading()
            self._paused = True

    @property
    def buffered(self) -> int:
        """Plaintext waiting for the parser."""
        return len(self._plain)

    # -- internals -----------------------------------------------------------------------------------

    def _decrypt(self) -> None:
        tls = self._tls
        assert tls is not None
        try:
            while True:
                chunk = tls.read(READ_STEP)
                if not chunk:
                    self._eof = True
                    break
                self._plain += chunk
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self._eof = True  # close_notify from the client
        except ssl.SSLError as exc:
            self._lost = exc
            self._eof = True
        self._flush()

    def _flush(self) -> None:
        outgoing = self._outgoing
        if outgoing is not None and outgoing.pending and self._transport is not None and not self._closed:
            self._transport.write(outgoing.read())

    def _flow(self) -> None:
        transport = self._transport
        if transport is None or self._closed or self._ignoring:
            return
        pending = len(self._plain) + (self._incoming.pending if self._incoming is not None else 0)
        if pending > MAX_PENDING and not self._paused:
            transport.pause_reading()
            self._paused = True
        elif pending <= MAX_PENDING and self._paused:
            transport.resume_reading()
            self._paused = False

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
