"""Consumer token hashes: parsing the hash Secret and comparing hashes without timing leaks.

The provider never sees a token in clear at rest: the Secret holds SHA-256 hex digests, one per line, so
that several tokens can be valid at once during a rotation. Lines that are not a digest are skipped and
only counted, because a line may be a pasted token or other secret material that must never be logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

SHA256_HEX_RE = "^[0-9a-fA-F]{64}$"


@dataclass(frozen=True)
class TokenHashes:
    """The valid digests of one Secret key (lowercase) and how many non-empty lines were skipped."""

    hashes: frozenset[str]
    ignored_lines: int

    def matches(self, token_hash: str) -> bool:
        """True if `token_hash` equals one of the digests; compares against all of them in constant time."""
        found = False
        for candidate in self.hashes:
            found |= constant_time_equal(candidate, token_hash.lower())
        return found


def _decode_line(raw: bytes) -> str | None:
    """A line as text, or None if it is not valid UTF-8 (such a line is skipped, never decoded lossily)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_token_hashes(value: bytes | str) -> TokenHashes:
    """Parse the content of a hash Secret key: one SHA-256 hex digest per line.

    Empty lines and surrounding whitespace (including the CR of CRLF) are ignored; upper and lower case
    are equal; any other line, including one that is not UTF-8, is skipped and counted in `ignored_lines`
    (the caller logs the count once, never the line).
    """
    if isinstance(value, str):
        lines: list[str | None] = list(value.split("\n"))
    else:
        lines = [_decode_line(raw) for raw in bytes(value).split(b"\n")]
    if lines and lines[0] is not None:
        lines[0] = lines[0].removeprefix("\ufeff")
    hashes: set[str] = set()
    ignored = 0
    for line in lines:
        text = None if line is None else line.strip()
        if text == "":
            continue
        if text is not None and re.fullmatch(SHA256_HEX_RE, text):
            hashes.add(text.lower())
        else:
            ignored += 1
    return TokenHashes(hashes=frozenset(hashes), ignored_lines=ignored)


def hash_token(token: str) -> str:
    """SHA-256 of the token exactly as sent (UTF-8, no trailing newline), as lowercase hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def constant_time_equal(a: str, b: str) -> bool:
    """Compare two strings without leaking where they differ (works for non-ASCII input too)."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))
