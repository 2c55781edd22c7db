"""The admin (provisioner) connection of a shard: its Secret, its endpoint and reusable sessions.

The admin Secret is read by name on every use, uncached (the provider may `get` exactly the
names in shardSecrets and has no list/watch), so a rotated or broken Secret shows at once.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.specs import ShardSpec
from informers import SECRETS, Rest
from reconciler.credentials import secret_values
from reconciler.sql.session import AdminEndpoint, AdminSession


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


@dataclass
class _Entry:
    fingerprint: str
    session: AdminSession


class AdminSessions:
    """One reusable AdminSession per (worker thread, shard), reopened when the endpoint changes."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self._local = threading.local()
        self._connect_timeout = connect_timeout
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
            entry = _Entry(
                fingerprint,
                AdminSession.for_endpoint(endpoint, connect_timeout=self._connect_timeout),
            )
            sessions[shard] = entry
            with self._lock:
                self._all.append(entry.session)
        return entry.session

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
