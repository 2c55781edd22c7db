"""Validation of Shard `client.host`, the host that consumers are told to connect to.

Consumers paste the host into shell probes and connection strings, so only a plain RFC-1123 hostname or a
dotted-quad IPv4 address is allowed. The rule is written once, as regex strings in the common subset of
Python `re` and RE2 (no lookarounds, no backreferences, no escapes, ASCII classes only, anchored), so the
very same strings serve the Python check here and the CRD's CEL rule built by `cel_host_rule`.

A name whose labels are all numeric (decimal, or `0x` hex as glibc `inet_aton` reads them) is accepted
only if it is a canonical dotted quad: `0x7f.1`, `127.1` or `010.0.0.1` would otherwise resolve to an
address different from what a reader of the Shard sees.
"""

from __future__ import annotations

import re

HOST_MAX_LENGTH = 253

_LABEL = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_NUMERIC_LABEL = "([0-9]+|0[xX][0-9a-fA-F]*)"

# Dot-separated labels of 1-63 letters, digits and hyphens, no hyphen at either end, no trailing dot.
HOSTNAME_RE = f"^{_LABEL}([.]{_LABEL})*$"
# Exactly four decimal parts 0-255 without leading zeros ("0" itself is fine).
IPV4_RE = f"^{_OCTET}([.]{_OCTET}){{3}}$"
# Every label numeric as inet_aton would parse it: decimal/octal digits or 0x-hex.
NUMERIC_NAME_RE = f"^{_NUMERIC_LABEL}([.]{_NUMERIC_LABEL})*$"

_SAFE_TO_ECHO_RE = "[A-Za-z0-9.-]{1,253}"

CEL_HOST_MESSAGE = (
    "must be an RFC-1123 hostname without a trailing dot or a dotted-quad IPv4 address without leading "
    "zeros; IPv6 is refused"
)


class InvalidHost(ValueError):
    """A client host that consumers must not be given; the message never echoes unsafe characters."""


def _cel_string(value: str) -> str:
    """Quote `value` as a CEL single-quoted string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_host_rule(field_expr: str = "self") -> str:
    """The CEL expression the CRD uses for a host field; the same constants as `is_valid_client_host`."""
    e = field_expr
    return (
        f"{e}.size() <= {HOST_MAX_LENGTH} && ({e}.matches({_cel_string(IPV4_RE)}) || "
        f"({e}.matches({_cel_string(HOSTNAME_RE)}) && !{e}.matches({_cel_string(NUMERIC_NAME_RE)})))"
    )


def is_valid_client_host(host: object) -> bool:
    """True if `host` may be handed to consumers (see the module docstring for the rule)."""
    if not isinstance(host, str) or len(host) > HOST_MAX_LENGTH:
        return False
    if re.fullmatch(IPV4_RE, host):
        return True
    return bool(re.fullmatch(HOSTNAME_RE, host)) and not re.fullmatch(NUMERIC_NAME_RE, host)


def _explain(host: str) -> str:
    """Say what is wrong with an invalid host; only called after the regex rule refused it."""
    if host == "":
        return "must not be empty"
    if len(host) > HOST_MAX_LENGTH:
        return f"must be at most {HOST_MAX_LENGTH} characters long (has {len(host)})"
    if not host.isascii():
        return "must contain only ASCII letters, digits, hyphens and dots"
    if host.count(":") >= 2 or host.startswith("["):
        return "IPv6 addresses are refused, use a hostname or an IPv4 address"
    if ":" in host:
        return "must not contain a port (the port is a field of its own)"
    if not re.fullmatch("[A-Za-z0-9.-]+", host):
        return "may contain only letters, digits, hyphens and dots"
    if host.endswith("."):
        return "must not end with a dot"
    labels = host.split(".")
    if "" in labels:
        return "must not start with a dot or contain consecutive dots"
    if any(len(label) > 63 for label in labels):
        return "each dot-separated label must be at most 63 characters long"
    if any(label.startswith("-") or label.endswith("-") for label in labels):
        return "labels must not start or end with a hyphen"
    if re.fullmatch(NUMERIC_NAME_RE, host):
        return "an all-numeric name must be a dotted-quad IPv4 address (four parts 0-255, no leading zeros, no hex)"
    return "is not a hostname or an IPv4 address"


def validate_client_host(host: object) -> str:
    """Return `host` unchanged if valid, else raise InvalidHost explaining why."""
    if not isinstance(host, str):
        raise InvalidHost("client host must be a string")
    if is_valid_client_host(host):
        return host
    shown = f" {host!r}" if re.fullmatch(_SAFE_TO_ECHO_RE, host) else ""
    raise InvalidHost(f"invalid client host{shown}: {_explain(host)}")
