"""Strict request framing (api/http1.py): what is refused, and what ordinary clients send still parses."""

from __future__ import annotations

import pytest

from api.http1 import BadRequest, parse_chunk_size, parse_head


def head(*lines: str, request_line: str = "POST /v1/databases/x HTTP/1.1") -> bytes:
    return "\r\n".join([request_line, *lines]).encode("latin-1")


def test_ordinary_requests_parse() -> None:
    parsed = parse_head(head("Host: api", "Content-Length: 12", "Content-Type: application/json"))
    assert (parsed.method, parsed.target, parsed.content_length) == ("POST", "/v1/databases/x", 12)
    assert not parsed.chunked
    assert parsed.keep_alive
    chunked = parse_head(head("Host: api", "Transfer-Encoding: Chunked"))
    assert chunked.chunked and chunked.content_length == 0
    old = parse_head(head(request_line="GET /healthz HTTP/1.0"))
    assert not old.keep_alive
    assert parse_head(head("Connection: keep-alive", request_line="GET /healthz HTTP/1.0")).keep_alive
    assert not parse_head(head("Host: api", "Connection: close", request_line="GET / HTTP/1.1")).keep_alive
    assert parse_head(head("Host: api", "Expect: 100-continue", "Content-Length: 3")).expect_continue


def test_header_names_with_underscores_are_dropped() -> None:
    """`X_Forwarded_For` would reach the app as HTTP_X_FORWARDED_FOR, like `X-Forwarded-For`."""
    parsed = parse_head(head("Host: api", "X_Forwarded_For: 10.0.0.1", "Content_Length: 5"))
    assert parsed.headers == (("host", "api"),)
    assert parsed.content_length == 0


@pytest.mark.parametrize(
    ("block", "status"),
    [
        (head("Transfer-Encoding: chunked", request_line="POST / HTTP/1.0"), 400),
        (head("Host: a", "Content-Length: 3", "Transfer-Encoding: chunked"), 400),
        (head("Host: a", "Content-Length: 3", "Content-Length: 3"), 400),
        (head("Host: a", "Content-Length: 3", "Content-Length: 4"), 400),
        (head("Host: a", "Content-Length: 1_0"), 400),
        (head("Host: a", "Content-Length: +2"), 400),
        (head("Host: a", "Content-Length: -1"), 400),
        (head("Host: a", "Content-Length: 3, 3"), 400),
        (head("Host: a", "Content-Length: 0x10"), 400),
        (head("Host: a", "Content-Length: 1" + "0" * 18), 400),
        (head("Host: a", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400),
        (head("Host: a", "Transfer-Encoding: gzip"), 400),
        (head("Host: a", "Transfer-Encoding: chunked, identity"), 400),
        (head("Host: a", "X-A: 1", " folded"), 400),
        (head("Host: a", "Content-Length : 3"), 400),
        (head("Host: a", "X-A: a\x00b"), 400),
        (head("Host: a\nX-B: 1"), 400),
        (head("Host: a", "Host: b"), 400),
        (head("X-A: 1"), 400),
        (head("Host: a", request_line="GET http://evil/ HTTP/1.1"), 400),
        (head("Host: a", request_line="GET /a b HTTP/1.1"), 400),
        (head("Host: a", request_line="GET / HTTP/2.0"), 505),
        (head("Host: a", request_line="GET / FTP/1.1"), 400),
        (head("Host: a", *[f"X-{n}: 1" for n in range(101)]), 431),
    ],
)
def test_ambiguous_or_malformed_heads_are_refused(block: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_head(block)
    assert refused.value.status == status


@pytest.mark.parametrize(("line", "size"), [(b"0", 0), (b"1f", 31), (b"A;name=value", 10)])
def test_chunk_sizes(line: bytes, size: int) -> None:
    assert parse_chunk_size(line) == size


@pytest.mark.parametrize("line", [b"", b"0x1", b"+1", b"1 ", b"123456789", b"g"])
def test_bad_chunk_sizes_are_refused(line: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_chunk_size(line)
