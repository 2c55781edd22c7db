"""client.host rule: the shared vector table against the Python implementation."""

from __future__ import annotations

import re

import pytest

from domain import hosts
from tests.vectors.hosts import HOST_VECTORS

VALID = [(h, why) for h, ok, why in HOST_VECTORS if ok]
INVALID = [(h, why) for h, ok, why in HOST_VECTORS if not ok]
UNSAFE_IN_MESSAGES = set(';&|`$<>\\"*?!{}[]\n\r\t\x00')
SAFE_TO_ECHO = re.compile("[A-Za-z0-9.-]{1,253}")


def test_vector_table_is_large_unique_and_covers_both_sides() -> None:
    names = [h for h, _, _ in HOST_VECTORS]
    assert len(HOST_VECTORS) >= 60
    assert len(names) == len(set(names)), "duplicate vectors"
    assert len(VALID) >= 20 and len(INVALID) >= 40
    assert all(isinstance(h, str) and isinstance(ok, bool) and why for h, ok, why in HOST_VECTORS)


@pytest.mark.parametrize(("host", "why"), VALID, ids=[w for _, w in VALID])
def test_valid_hosts_are_accepted(host: str, why: str) -> None:
    assert hosts.is_valid_client_host(host), why
    assert hosts.validate_client_host(host) == host


@pytest.mark.parametrize(("host", "why"), INVALID, ids=[w for _, w in INVALID])
def test_invalid_hosts_are_refused_with_a_safe_message(host: str, why: str) -> None:
    assert not hosts.is_valid_client_host(host), why
    with pytest.raises(hosts.InvalidHost) as excinfo:
        hosts.validate_client_host(host)
    message = str(excinfo.value)
    assert message.startswith("invalid client host")
    # Never a control character, a shell metacharacter or non-ASCII text in the message.
    assert message.isascii() and not set(message) & UNSAFE_IN_MESSAGES
    if SAFE_TO_ECHO.fullmatch(host):
        assert repr(host) in message
    else:
        assert repr(host) not in message


def test_invalid_host_is_a_value_error() -> None:
    assert issubclass(hosts.InvalidHost, ValueError)


@pytest.mark.parametrize("value", [None, 1, b"example.com", ["a"]])
def test_non_strings_are_refused(value: object) -> None:
    assert not hosts.is_valid_client_host(value)
    with pytest.raises(hosts.InvalidHost, match="must be a string"):
        hosts.validate_client_host(value)


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("", "must not be empty"),
        ("a" * 254, "at most 253"),
        ("::1", "IPv6"),
        ("[::1]", "IPv6"),
        ("example.com:5432", "port"),
        ("a_b", "only letters, digits, hyphens and dots"),
        ("ünicode.de", "ASCII"),
        ("host.", "end with a dot"),
        ("a..b", "consecutive dots"),
        ("a" * 64, "at most 63"),
        ("-a", "hyphen"),
        ("256.1.1.1", "dotted-quad"),
        ("0x7f.1", "dotted-quad"),
    ],
)
def test_messages_say_what_is_wrong(host: str, reason: str) -> None:
    with pytest.raises(hosts.InvalidHost, match=re.escape(reason)):
        hosts.validate_client_host(host)


@pytest.mark.parametrize("pattern", [hosts.HOSTNAME_RE, hosts.IPV4_RE, hosts.NUMERIC_NAME_RE])
def test_patterns_stay_in_the_re2_and_cel_safe_subset(pattern: str) -> None:
    assert pattern.startswith("^") and pattern.endswith("$")
    assert "\\" not in pattern and "'" not in pattern and '"' not in pattern
    assert "(?" not in pattern, "no lookarounds, flags or named groups"
    re.compile(pattern)


def test_cel_rule_is_built_from_the_constants() -> None:
    rule = hosts.cel_host_rule()
    assert rule == (
        f"self.size() <= {hosts.HOST_MAX_LENGTH} && (self.matches('{hosts.IPV4_RE}') || "
        f"(self.matches('{hosts.HOSTNAME_RE}') && !self.matches('{hosts.NUMERIC_NAME_RE}')))"
    )
    assert hosts.cel_host_rule("self.client.host").count("self.client.host.") == 4
    assert hosts.HOST_MAX_LENGTH == 253


def _cel_rule_in_python(host: str) -> bool:
    """The CEL expression evaluated literally in Python (CEL `matches` is an unanchored search)."""
    return len(host) <= hosts.HOST_MAX_LENGTH and (
        re.search(hosts.IPV4_RE, host) is not None
        or (re.search(hosts.HOSTNAME_RE, host) is not None and re.search(hosts.NUMERIC_NAME_RE, host) is None)
    )


@pytest.mark.parametrize(("host", "expected", "why"), HOST_VECTORS, ids=[w for _, _, w in HOST_VECTORS])
def test_search_semantics_agree_with_fullmatch(host: str, expected: bool, why: str) -> None:
    # Python's `$` also matches before a final newline; the vectors prove that cannot slip through here.
    # (The RE2 run in test_domain_hosts_re2.py checks the real engine.)
    if host.endswith("\n"):
        assert not expected
        return
    assert _cel_rule_in_python(host) is expected, why
