"""Strict HTTP/1.x request framing for the API's front door (api/server.py).

Pure functions over bytes, so every rule is testable without a socket. The rules close the gaps
request smuggling is built from: a request whose framing is ambiguous is refused (400) and its
connection closed, never guessed at.

- request line `METHOD SP origin-form SP HTTP/1.0|HTTP/1.1`, CRLF line ends only, no obs-fold;
- header names are tokens (no space before the colon); names with `_` are dropped, as nginx does
  (in WSGI's HTTP_* keys `X_A` would alias `X-A`);
- `Content-Length` at most once, decimal digits only (`1_0`, `+2`, `2, 2` are refused);
- `Transfer-Encoding` only on HTTP/1.1, only `chunked`, never with `Content-Length`;
- HTTP/1.1 requires exactly one `Host`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN_RE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
_TARGET_RE = re.compile(rb"/[!-~]*")  # origin-form: visible ASCII, no spaces or controls
_VALUE_BAD_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # CTLs except HTAB
_DECIMAL_RE = re.compile(rb"[0-9]{1,18}")
_CHUNK_SIZE_RE = re.compile(rb"([0-9A-Fa-f]{1,8})(;[!-~\t ]*)?")
MAX_HEADERS = 100


class BadRequest(Exception):
    """A request refused before it reaches the app; the connection is closed after the answer."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


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


def parse_head(block: bytes) -> RequestHead:
    """Parse a header block (request line to the blank line, without the final CRLFCRLF)."""
    lines = block.split(b"\r\n")
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise BadRequest("bare CR or LF")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise BadRequest("malformed request line")
    method, target, version = parts
    if not _TOKEN_RE.fullmatch(method):
        raise BadRequest("malformed method")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest("unsupported HTTP version", 505 if version.startswith(b"HTTP/") else 400)
    if not _TARGET_RE.fullmatch(target):
        raise BadRequest("request target is not in origin form")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest("too many header fields", 431)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN_RE.fullmatch(name):
            raise BadRequest("malformed header field")  # obs-fold, space before ':' or junk
        value = value.strip(b" \t")
        if _VALUE_BAD_RE.search(value):
            raise BadRequest("control character in a header value")
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
        raise BadRequest("duplicate Content-Length")
    if lengths and not _DECIMAL_RE.fullmatch(lengths[0].encode("latin-1")):
        raise BadRequest("Content-Length is not a decimal number")
    if codings and not http11:
        raise BadRequest("Transfer-Encoding on HTTP/1.0")
    if codings and lengths:
        raise BadRequest("Content-Length together with Transfer-Encoding")
    if codings and (len(codings) > 1 or codings[0].lower() != "chunked"):
        raise BadRequest("Transfer-Encoding other than a single chunked")
    if http11 and len(hosts) != 1:
        raise BadRequest("HTTP/1.1 needs exactly one Host")
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
        raise BadRequest("malformed chunk size")
    return int(match.group(1), 16)
