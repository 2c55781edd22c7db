"""Where a shard's admin (provisioner) credentials may be sent: the rules the reconciler applies
before it opens a connection, and `dbprovider lint` reports before a merge.

Whoever writes a Shard chooses the host, port and sslmode of the admin login. Two rules keep the
credential with the server it belongs to:

- TLS: the login goes only over TLS, where SCRAM is bound to the TLS channel; an sslmode that may go
  without TLS (disable, allow, prefer) needs the install to name the shard in
  shardTLS.cleartextShards (`tls_refusal`);
- binding: an admin Secret bound to an endpoint (its shardSecrets entry's host and port, else the
  Secret's own `host` and `port` keys, as Percona's pguser Secrets have) is sent only there
  (`EndpointBinding`, `bound_endpoint`). An unbound Secret still needs TLS, but its SCRAM proof goes to
  any server with TLS a Shard names, where a weak password can be guessed offline: `dbprovider lint` and
  `upgrade check` warn about it (`UNBOUND_ADVICE`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from domain.constants import SslMode

# The keys of an admin Secret that bind it to its endpoint (those of Percona's pguser Secrets).
SECRET_HOST_KEY = "host"
SECRET_PORT_KEY = "port"


def tls_refusal(shard: str, sslmode: str, cleartext_shards: Collection[str]) -> str | None:
    """Why this Shard's admin login may not use `sslmode`, or None when it may."""
    if SslMode(sslmode).always_tls or shard in cleartext_shards:
        return None
    return (
        f"admin.sslmode {sslmode} may log in without TLS, where nothing binds the login to the server; use "
        "require, verify-ca or verify-full (or name the shard in the install's shardTLS.cleartextShards)"
    )


@dataclass(frozen=True)
class OutsidePod:
    """How a process outside the cluster's pods reaches the shards' admin ports (dev, tests, `upgrade
    check` over port-forwards); the default is a pod's way.

    `admin_host` replaces every Shard's admin Service host (the Shard's port stays); `ca_file` verifies
    verify-ca/-full shards instead of the bundle mounted from shardTLS.caBundle.
    """

    admin_host: str | None = None
    ca_file: str | None = None


@dataclass(frozen=True)
class EndpointBinding:
    """The one admin endpoint a Secret may be sent to (an unset part is not checked)."""

    host: str | None = None
    port: int | None = None

    @classmethod
    def of_secret(cls, values: Mapping[str, str]) -> EndpointBinding | None:
        """The endpoint a Secret names itself (`host`, `port` keys), or None. A port that is not a
        number binds to no port at all, so nothing matches it."""
        host, port = values.get(SECRET_HOST_KEY), values.get(SECRET_PORT_KEY)
        if not host and not port:
            return None
        number = int(port) if port and port.isdigit() else (-1 if port else None)
        return cls(host or None, number)

    def allows(self, host: str, port: int) -> bool:
        """`host` is the bound host, or the bound host is `host` plus a cluster domain
        (`pg-primary.ns.svc` matches `pg-primary.ns.svc.cluster.local`)."""
        if self.port is not None and self.port != port:
            return False
        if self.host is None:
            return True
        bound = self.host.lower().rstrip(".")
        return bound == host or bound.startswith(host + ".")

    @property
    def binds(self) -> bool:
        return self.host is not None or self.port is not None

    def refusal(self, secret: str, host: str, port: int) -> str | None:
        """Why Secret `secret` (namespace/name) may not go to host:port, or None when it may."""
        if self.allows(host, port):
            return None
        return (
            f"admin Secret {secret} may only be sent to {self.host or host}:{self.port or port}, "
            f"not to the Shard's {host}:{port}"
        )


def bound_endpoint(entry: EndpointBinding | None, values: Mapping[str, str] | None) -> EndpointBinding | None:
    """The endpoint an admin Secret is bound to, or None: its shardSecrets entry's `host`/`port` if set,
    else the Secret's own keys (`values`: its decoded data; None when it was not read)."""
    if entry is not None and entry.binds:
        return entry
    return EndpointBinding.of_secret(values) if values is not None else None


# What lint and upgrade check tell about an admin Secret bound to no endpoint.
UNBOUND_ADVICE = (
    "is bound to no endpoint: the provisioner's SCRAM proof goes to whatever server with TLS a Shard names, "
    "where a weak password can be guessed offline. Bind it: set host and port on its shardSecrets entry "
    "(the Shard's admin Service host and port), or give the Secret host and port keys"
)
