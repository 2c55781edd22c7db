"""Strict HTTP/1.x request framing for the API's front door (api/server.py).

Sans-IO: `RequestParser` is fed the bytes a connection received and hands out whole requests, so every
rule is testable without a socket, and a body costs no event-loop round trip per chunk. The rules
close the gaps request smuggling is built from: a request whose framing is ambiguous is refused (400)
and its connection closed, never guessed at. tests/unit/api/test_http1_differential.py holds them against
h11 and llhttp: no byte stream makes this parser see a request that either of them frames differently.

- request line `METHOD SP origin-form SP HTTP/1.0|HTTP/1.1` (METHOD one of `METHODS`), CRLF line ends
  only (a bare LF or CR is refused as soon as it arrives), no obs-fold;
- header names are tokens (no space before the colon); names with `_` are dropped, as nginx does
  (in WSGI's HTTP_* keys `X_A` would alias `X-A`);
- `Content-Length` at most once, decimal digits only (`1_0`, `+2`, `2, 2` are refused);
- `Transfer-Encoding` only on HTTP/1.1, only `chunked`, never with `Content-Length`;
- at most one `Host`, and exactly one on HTTP/1.1;
- a chunked body: size lines of hex digits with at most `MAX_CHUNK_LINE` bytes of extensions, each
  chunk followed by CRLF, trailer fields by the header-field rules (and no framing field among them);
  the body limit counts what is on the wire (size lines, extensions, CRLFs, trailers), and the number
  of chunks is bounded. The decoded body is collected into one buffer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"  # RFC 9110 token
_TOKEN_RE = re.compile(_TOKEN)
_TARGET_RE = re.compile(rb"/[!-~]*")  # origin-form: visible ASCII, no spaces or controls
_VALUE_BAD_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # CTLs except HTAB
_DECIMAL_RE = re.compile(rb"[0-9]{1,18}")
_QUOTED = rb'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
# chunk-size *( ";" token [ "=" ( token / quoted-string ) ] ), no whitespace (as llhttp requires)
_CHUNK_SIZE_RE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:;" + _TOKEN + rb"(?:=(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?)*")
_CHUNK_LINE_RE = re.compile(_CHUNK_SIZE_RE.pattern + rb"\r\n")  # the fast path: a whole, valid size line
MAX_HEADERS = 100  # header fields, and trailer fields, per request
# The methods a request may have (others are refused: the references do not frame them alike).
METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"})
MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions
DEFAULT_MAX_CHUNKS = 128
# Fields that frame or route a request: never accepted as trailers (RFC 9110 section 6.5.1).
_NOT_TRAILERS = frozenset({b"content-length", b"transfer-encoding", b"host", b"connection", b"expect"})


class BadRequest(Exception):
    """A request refused before it reaches the app; the connection is closed after the answer.

    `code` is the refusal's metric label (a small fixed set), `reason` the text logged with it.
    """

    def __init__(self, reason: str, status: int = 400, code: str = "framing") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.code = code


@dataclass(frozen=True)
class RequestHead:
    """A parsed request line and header block. Header names are lowercase, in arrival order."""

    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: tuple[tuple[str, str], ...]
    content_length: int  # 0 when no body
    chunked: bool
    keep_alive: bool
    expect_continue: bool


def _line_ends_ok(data: bytes | bytearray, start: int, end: int) -> int:
    """The index of the first bare LF in data[start:end] (an LF not preceded by CR), or -1."""
    position = data.find(b"\n", start, end)
    while position >= 0:
        if position == 0 or data[position - 1] != 0x0D:
            return position
        position = data.find(b"\n", position + 1, end)
    return -1


def _field(line: bytes) -> tuple[bytes, bytes]:
    """(name, value) of a header or trailer field line; raises BadRequest for anything but token ':' value."""
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN_RE.fullmatch(name):
        raise BadRequest("malformed header field", code="headerField")  # obs-fold, space before ':' or junk
    value = value.strip(b" \t")
    if _VALUE_BAD_RE.search(value):
        raise BadRequest("control character in a header value", code="headerField")
    return name, value


def parse_head(block: bytes) -> RequestHead:
    """Parse a header block (request line to the blank line, without the final CRLFCRLF)."""
    lines = block.split(b"\r\n")
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise BadRequest("bare CR or LF", code="lineEnd")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise BadRequest("malformed request line", code="requestLine")
    method, target, version = parts
    if method not in METHODS:
        raise BadRequest("unknown method", 501 if _TOKEN_RE.fullmatch(method) else 400, code="requestLine")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest("unsupported HTTP version", 505 if version.startswith(b"HTTP/") else 400, code="version")
    if not _TARGET_RE.fullmatch(target):
        raise BadRequest("request target is not in origin form", code="requestLine")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest("too many header fields", 431, code="headersTooLarge")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, value = _field(line)
        if line.endswith(b"\t") and name.lower() in (b"transfer-encoding", b"content-length"):
            raise BadRequest("a tab after a framing field's value", code="transferEncoding")  # llhttp refuses it
        if b"_" in name:
            continue  # dropped, as nginx does: in WSGI's HTTP_* keys it would alias a name with '-'
        headers.append((name.decode("ascii").lower(), value.decode("latin-1")))
    return _framing(method.decode("ascii"), target.decode("ascii"), version.decode("ascii"), tuple(headers))


def _framing(method: str, target: str, version: str, headers: tuple[tuple[str, str], ...]) -> RequestHead:
    lengths = [v for n, v in headers if n == "content-length"]
    codings = [v for n, v in headers if n == "transfer-encoding"]
    hosts = [v for n, v in headers if n == "host"]
    http11 = version == "HTTP/1.1"
    if len(lengths) > 1:
        raise BadRequest("duplicate Content-Length", code="contentLength")
    if lengths and not _DECIMAL_RE.fullmatch(lengths[0].encode("latin-1")):
        raise BadRequest("Content-Length is not a decimal number", code="contentLength")
    if codings and not http11:
        raise BadRequest("Transfer-Encoding on HTTP/1.0", code="transferEncoding")
    if codings and lengths:
        raise BadRequest("Content-Length together with Transfer-Encoding", code="transferEncoding")
    if codings and (len(codings) > 1 or codings[0].lower() != "chunked"):
        raise BadRequest("Transfer-Encoding other than a single chunked", code="transferEncoding")
    if len(hosts) > 1:
        raise BadRequest("more than one Host", code="host")
    if http11 and not hosts:
        raise BadRequest("HTTP/1.1 needs a Host", code="host")
    tokens = {t.strip().lower() for n, v in headers if n == "connection" for t in v.split(",")}
    keep_alive = "close" not in tokens if http11 else "keep-alive" in tokens
    expect = [v.lower() for n, v in headers if n == "expect"]
    return RequestHead(
        method=method,
        target=target,
        version=version,
        headers=headers,
        content_length=int(lengths[0]) if lengths else 0,
        chunked=bool(codings),
        keep_alive=keep_alive,
        expect_continue=http11 and expect == ["100-continue"],
    )


def parse_chunk_size(line: bytes) -> int:
    """The size of a chunk from its size line (without CRLF); extensions are ignored."""
    match = _CHUNK_SIZE_RE.fullmatch(line)
    if match is None:
        raise BadRequest("malformed chunk size", code="chunk")
    return int(match.group(1), 16)


class ChunkedBody:
    """A chunked body decoded as its bytes arrive, counting every byte on the wire and every chunk.

    `feed(buffer)` consumes what it can and returns how much; `done` once the trailer section ended.
    """

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self, max_wire_bytes: int, max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        self.max_wire_bytes = max_wire_bytes
        self.max_chunks = max_chunks
        self.body = bytearray()
        self.wire_bytes = 0
        self.chunks = 0
        self.trailers = 0
        self.done = False
        self._state = self._SIZE
        self._remaining = 0

    def _account(self, count: int) -> None:
        self.wire_bytes += count
        if self.wire_bytes > self.max_wire_bytes:
            raise BadRequest("request body too large (on the wire)", 413, code="bodyTooLarge")

    def _line(self, data: bytearray, start: int, what: str) -> bytes | None:
        """The next CRLF-terminated line from `start`, without its CRLF; None if not complete yet."""
        end = data.find(b"\n", start, start + MAX_CHUNK_LINE + 2)
        if end < 0:
            if len(data) - start > MAX_CHUNK_LINE + 1:
                raise BadRequest(f"{what} line too long", code="chunk" if what == "chunk size" else "trailer")
            return None
        if end == start or data[end - 1] != 0x0D:
            raise BadRequest(f"bare LF in a {what} line", code="lineEnd")
        line = bytes(data[start : end - 1])
        if b"\r" in line:
            raise BadRequest(f"bare CR in a {what} line", code="lineEnd")
        return line

    def feed(self, data: bytearray) -> int:
        """Decode what `data` holds from its start; returns the number of bytes consumed."""
        position = 0
        match_line = _CHUNK_LINE_RE.match
        while not self.done:
            if self._state == self._SIZE:
                whole = match_line(data, position)  # fast path: a valid size line and its whole chunk
                if whole is not None and (size := int(whole.group(1), 16)):
                    start = whole.end()
                    end = start + size
                    if len(data) >= end + 2:
                        if data[end : end + 2] != b"\r\n":
                            raise BadRequest("chunk without its CRLF", code="chunk")
                        self.chunks += 1
                        if self.chunks > self.max_chunks:
                            raise BadRequest(f"more than {self.max_chunks} chunks", 413, code="tooManyChunks")
                        self._account(end + 2 - position)
                        self.body += data[start:end]
                        position = end + 2
                        continue
                line = self._line(data, position, "chunk size")
                if line is None:
                    break
                self._account(len(line) + 2)
                position += len(line) + 2
                size = parse_chunk_size(line)
                if size == 0:
                    self._state = self._TRAILER
                    continue
                self.chunks += 1
                if self.chunks > self.max_chunks:
                    raise BadRequest(f"more than {self.max_chunks} chunks", 413, code="tooManyChunks")
                self._account(size)  # refuse at once what would exceed the limit
                self._remaining, self._state = size, self._DATA
            elif self._state == self._DATA:
                take = min(self._remaining, len(data) - position)
                if take == 0:
                    break
                self.body += data[position : position + take]
                position += take
                self._remaining -= take
                if not self._remaining:
                    self._state = self._DATA_END
            elif self._state == self._DATA_END:
                ending = data[position : position + 2]
                if ending not in (b"\r\n", b"\r"[: len(ending)]):
                    raise BadRequest("chunk without its CRLF", code="chunk")
                if len(ending) < 2:
                    break
                self._account(2)
                position += 2
                self._state = self._SIZE
            else:
                line = self._line(data, position, "trailer")
                if line is None:
                    break
                self._account(len(line) + 2)
                position += len(line) + 2
                if not line:
                    self.done = True
                    break
                self._trailer(line)
        return position

    def _trailer(self, line: bytes) -> None:
        try:
            name, _ = _field(line)
        except BadRequest as exc:
            raise BadRequest(f"trailer: {exc.reason}", code="trailer") from None
        if name.lower() in _NOT_TRAILERS:
            raise BadRequest("a framing field in the trailers", code="trailer")
        self.trailers += 1
        if self.trailers > MAX_HEADERS:
            raise BadRequest("too many trailer fields", 431, code="trailer")


class RequestParser:
    """The framing state of one connection: `feed(bytes)`, then `head()` and `body()` in turn.

        parser.feed(data)
        head = parser.head()        # None until the header block is complete
        body = parser.body()        # None until the whole body arrived; then the next request begins

    Raises BadRequest as soon as the bytes received break a rule (a bare LF is refused when it
    arrives, not when the block completes). Bytes after a request stay buffered for the next one.
    """

    def __init__(self, max_header_bytes: int, max_body_bytes: int, max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.max_chunks = max_chunks
        self._buffer = bytearray()
        self._scanned = 0  # head bytes already checked for line ends
        self._head: RequestHead | None = None
        self._chunked: ChunkedBody | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not consumed yet (an unread body, or the start of the next request)."""
        return len(self._buffer)

    def head(self) -> RequestHead | None:
        """The current request's head once its header block is complete; None if more bytes are needed."""
        if self._head is not None:
            return self._head
        buffer = self._buffer
        limit = min(len(buffer), self.max_header_bytes + 4)
        end = buffer.find(b"\r\n\r\n", max(0, self._scanned - 3), limit)
        checked = end + 4 if end >= 0 else limit
        if _line_ends_ok(buffer, self._scanned, checked) >= 0:
            raise BadRequest("bare LF", code="lineEnd")
        self._scanned = checked
        if end < 0:
            if len(buffer) > self.max_header_bytes:
                raise BadRequest("request header block too large", 431, code="headersTooLarge")
            return None
        block = bytes(buffer[:end])
        del buffer[: end + 4]
        self._scanned = 0
        head = parse_head(block)
        if head.content_length > self.max_body_bytes:
            raise BadRequest("request body too large", 413, code="bodyTooLarge")
        self._head = head
        self._chunked = ChunkedBody(self.max_body_bytes, self.max_chunks) if head.chunked else None
        return head

    def body(self) -> bytes | None:
        """The current request's whole body (decoded); None if more bytes are needed. Call after head()."""
        head = self._head
        if head is None:
            raise RuntimeError("body() before a complete head()")
        buffer = self._buffer
        if self._chunked is not None:
            consumed = self._chunked.feed(buffer)
            del buffer[:consumed]
            if not self._chunked.done:
                return None
            body = bytes(self._chunked.body)
        else:
            if len(buffer) < head.content_length:
                return None
            body = bytes(buffer[: head.content_length])
            del buffer[: head.content_length]
        self._head = None
        self._chunked = None
        return body
