"""Where a shard's admin credentials may go (domain.admin_access): the TLS rule and endpoint bindings."""

from __future__ import annotations

import pytest

from domain.admin_access import EndpointBinding, tls_refusal

HOST = "pg-shard01-primary.databases.svc"


@pytest.mark.parametrize(
    ("sslmode", "listed", "refused"),
    [
        ("require", False, False),
        ("verify-ca", False, False),
        ("verify-full", False, False),
        ("disable", False, True),
        ("allow", False, True),
        ("prefer", False, True),
        ("disable", True, False),
        ("prefer", True, False),
    ],
)
def test_only_modes_that_always_use_tls_need_no_opt_out(sslmode: str, listed: bool, refused: bool) -> None:
    cleartext = ["shard01"] if listed else ["other"]
    assert (tls_refusal("shard01", sslmode, cleartext) is not None) is refused


@pytest.mark.parametrize(
    ("bound_host", "bound_port", "host", "port", "allowed"),
    [
        (HOST, 5432, HOST, 5432, True),
        (HOST + ".cluster.local", 5432, HOST, 5432, True),  # the cluster domain may follow
        (HOST + ".", None, HOST, 6543, True),  # a trailing dot; no port bound
        ("PG-SHARD01-PRIMARY.databases.svc", 5432, HOST, 5432, True),  # DNS names are case-insensitive
        (HOST, 5432, HOST, 5433, False),
        (HOST, None, "pg-shard02-primary.databases.svc", 5432, False),
        (HOST + "x", None, HOST, 5432, False),  # not a label boundary
        ("pg-shard01-primary.databases", None, HOST, 5432, False),  # shorter than the Shard's host
        (None, 5432, "anything.else.svc", 5432, True),  # only the port is bound
    ],
)
def test_a_binding_allows_exactly_its_endpoint(
    bound_host: str | None, bound_port: int | None, host: str, port: int, allowed: bool
) -> None:
    binding = EndpointBinding(bound_host, bound_port)
    assert binding.allows(host, port) is allowed
    assert (binding.refusal("ns/secret", host, port) is None) is allowed


@pytest.mark.parametrize(
    ("values", "binding"),
    [
        ({"user": "provisioner", "password": "x"}, None),
        ({"host": HOST, "port": "5432"}, EndpointBinding(HOST, 5432)),
        ({"host": HOST}, EndpointBinding(HOST, None)),
        ({"host": HOST, "port": "five"}, EndpointBinding(HOST, -1)),  # binds to no port: nothing matches
    ],
)
def test_a_secret_binds_itself_with_host_and_port_keys(values: dict[str, str], binding: EndpointBinding | None) -> None:
    assert EndpointBinding.of_secret(values) == binding
