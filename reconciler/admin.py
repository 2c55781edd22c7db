"""The admin (provisioner) connection of a shard: its Secret, its endpoint and reusable sessions.

The admin Secret is read by name, never through an informer (the provider may `get` exactly the
names in shardSecrets and has no list/watch). The Shard controller reads it on every health check,
so a rotated or broken Secret shows on the Shard within the check interval. The Database workers
reuse what they read for a few seconds (`AdminEndpointCache`): a burst of new databases on one
shard would otherwise read the same Secret once per database.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.specs import ShardSpec
from informers import SECRETS, Rest
from reconciler.credentials import secret_values
from reconciler.sql.session import APPLICATION_NAME, AdminEndpoint, AdminSession, Fence


class AdminSecretInvalid(Exception):
    """The admin Secret is missing, unreadable or lacks a key; the message names which (no values)."""


def read_admin_secret(rest: Rest, spec: ShardSpec) -> tuple[str, str]:
    """(user, password) from the Shard's admin Secret, read from the apiserver now."""
    ref = spec.admin.secret_ref
    try:
        secret = rest.get(SECRETS, ref.name, ref.namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise AdminSecretInvalid(f"admin Secret {ref.namespace}/{ref.name} not found") from None
        if exc.status == 403:
            raise AdminSecretInvalid(
                f"admin Secret {ref.namespace}/{ref.name} not readable (is it listed in shardSecrets?)"
            ) from None
        raise
    values = secret_values(secret)
    missing = [key for key in (ref.user_key, ref.password_key) if not values.get(key)]
    if missing:
        raise AdminSecretInvalid(
            f"admin Secret {ref.namespace}/{ref.name} lacks key {' and '.join(repr(k) for k in missing)}"
        )
    return values[ref.user_key], values[ref.password_key]


def admin_endpoint(rest: Rest, spec: ShardSpec, host_override: str | None = None) -> AdminEndpoint:
    """Where and as whom to run DDL on this shard.

    `host_override` replaces the in-cluster Service DNS name (kept: each shard's port) and exists
    for running the manager outside a cluster (`dbprovider dev`, tests).
    """
    user, password = read_admin_secret(rest, spec)
    return AdminEndpoint(
        host=host_override or spec.admin_host,
        port=spec.admin.port,
        user=user,
        password=password,
        sslmode=str(spec.admin.sslmode),
    )


ADMIN_ENDPOINT_TTL = 10.0


class AdminEndpointCache:
    """Each shard's admin endpoint as last read, reused for `ttl` seconds (errors are not kept).

    A rotated admin Secret reaches the Database workers within `ttl` (the seed allows the Shard 60 s
    to show it), and at once after a failed operation: the caller `forget`s the shard, so the retry
    reads the Secret again. A change of the Shard's admin block (another Secret, host or port)
    is a different key and is read at once.
    """

    def __init__(
        self,
        rest: Rest,
        host_override: str | None = None,
        ttl: float = ADMIN_ENDPOINT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = rest
        self.host_override = host_override
        self.ttl = ttl
        self.clock = clock
        self.reads = 0  # how often the Secret was read (what the cache saves is visible in tests)
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, float, AdminEndpoint]] = {}

    def get(self, shard: str, spec: ShardSpec) -> AdminEndpoint:
        """The endpoint of `shard`; AdminSecretInvalid or ApiException when its Secret cannot be used."""
        key = spec.admin.model_dump_json() + (self.host_override or spec.admin_host)
        now = self.clock()
        with self._lock:
            entry = self._entries.get(shard)
        if entry is not None and entry[0] == key and now - entry[1] < self.ttl:
            return entry[2]
        endpoint = admin_endpoint(self.rest, spec, self.host_override)
        with self._lock:
            self.reads += 1
            self._entries[shard] = (key, now, endpoint)
        return endpoint

    def forget(self, shard: str) -> None:
        with self._lock:
            self._entries.pop(shard, None)


@dataclass
class _Entry:
    fingerprint: str
    session: AdminSession


class AdminSessions:
    """One reusable AdminSession per (worker thread, shard), reopened when the endpoint changes.

    `fence` (leadership, from the composition root) is checked before every statement of every
    session handed out; `application_name` names this replica in the shards' logs and activity.
    """

    def __init__(
        self,
        connect_timeout: float = 10.0,
        *,
        fence: Fence | None = None,
        application_name: str = APPLICATION_NAME,
    ) -> None:
        self._local = threading.local()
        self._connect_timeout = connect_timeout
        self.fence = fence
        self.application_name = application_name
        self._all: list[AdminSession] = []  # every session of every thread, for close_all()
        self._lock = threading.Lock()

    @staticmethod
    def _fingerprint(endpoint: AdminEndpoint) -> str:
        raw = "\0".join([endpoint.host, str(endpoint.port), endpoint.user, endpoint.password, endpoint.sslmode])
        return hashlib.sha256(raw.encode()).hexdigest()

    def get(self, shard: str, endpoint: AdminEndpoint) -> AdminSession:
        sessions: dict[str, _Entry] = self._local.__dict__.setdefault("sessions", {})
        fingerprint = self._fingerprint(endpoint)
        entry = sessions.get(shard)
        if entry is None or entry.fingerprint != fingerprint:
            if entry is not None:
                entry.session.close()
                self._forget(entry.session)
            entry = _Entry(fingerprint, self.one_off(endpoint, self._connect_timeout))
            sessions[shard] = entry
            with self._lock:
                self._all.append(entry.session)
        return entry.session

    def one_off(self, endpoint: AdminEndpoint, connect_timeout: float) -> AdminSession:
        """A new session of its own (fenced and named like the others); the caller closes it."""
        return AdminSession.for_endpoint(
            endpoint, application_name=self.application_name, connect_timeout=connect_timeout, fence=self.fence
        )

    def close_all(self) -> None:
        """Close every session (the controllers have stopped): no connection outlives a leader term."""
        with self._lock:
            sessions, self._all = self._all, []
        for session in sessions:
            session.close()

    def drop(self, shard: str) -> None:
        sessions: dict[str, _Entry] = self._local.__dict__.setdefault("sessions", {})
        entry = sessions.pop(shard, None)
        if entry is not None:
            entry.session.close()
            self._forget(entry.session)

    def _forget(self, session: AdminSession) -> None:
        with self._lock:
            if session in self._all:
                self._all.remove(session)


def parse_shard_spec(shard: dict[str, Any]) -> ShardSpec:
    return ShardSpec.model_validate(shard.get("spec") or {})
