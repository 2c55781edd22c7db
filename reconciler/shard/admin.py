"""The admin (provisioner) connection of a shard: its Secret, its endpoint and reusable sessions.

Whoever may write a Shard chooses the host, port and sslmode the provisioner logs in to. The
credential must still only reach the server it belongs to (`AdminPolicy`), so three rules hold
before any connection is opened, each refusal naming the Shard's Ready reason (`AdminRefused`):

- only a Secret listed in the install's shardSecrets is ever used as admin credentials, in every
  namespace including the release namespace: no other Secret (a consumer's password, the API's TLS
  key) goes to a host of the Shard writer's choice (AdminSecretInvalid, before the Secret is read);
- the login goes only over TLS, where SCRAM is bound to the TLS channel (`channel_binding=require`):
  a relay between provider and shard, whether it passes TLS through or terminates it, can neither
  read the exchange nor use it for a session of its own. An sslmode that may go without TLS
  (disable, allow, prefer) is refused unless the install names the shard in
  shardTLS.cleartextShards (AdminTlsRequired);
- a Secret bound to an endpoint (its shardSecrets entry's host and port, else the Secret's own
  `host` and `port` keys, as Percona's pguser Secrets have) is sent only to that endpoint: the
  Shard's admin Service and port must be it (AdminEndpointMismatch).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from domain.admin_access import EndpointBinding, bound_endpoint, tls_refusal
from domain.config import InstallConfig
from domain.constants import SHARD_CA_FILE, ShardReason, SslMode
from domain.credentials import secret_values
from domain.settings import SETTINGS
from domain.specs import ShardSpec, parse_shard
from informers import SECRETS, Rest
from reconciler.runtime import Slot, current_slot
from reconciler.shard.links import ShardLinks
from reconciler.sql.session import APPLICATION_NAME, AdminEndpoint, AdminSession, Fence


class AdminRefused(Exception):
    """The provider will not log in to this Shard with these settings; `reason` is its Ready reason.

    The message says why (names of Secrets and hosts, never a value of the Secret).
    """

    reason = ShardReason.ADMIN_SECRET_INVALID


class AdminSecretInvalid(AdminRefused):
    """The admin Secret is unlisted, missing, unreadable or lacks a key; the message names which."""

    reason = ShardReason.ADMIN_SECRET_INVALID


class AdminTlsRequired(AdminRefused):
    """admin.sslmode may go without TLS and the install does not allow that for this shard."""

    reason = ShardReason.ADMIN_TLS_REQUIRED


class AdminEndpointMismatch(AdminRefused):
    """The admin Secret is bound to another endpoint than the one the Shard names."""

    reason = ShardReason.ADMIN_ENDPOINT_MISMATCH


@dataclass(frozen=True)
class AdminPolicy:
    """Which Secrets may be admin credentials and where to (shardSecrets), the shards that may log
    in without TLS (shardTLS.cleartextShards), and the CA file for verify-ca/-full.

    The default allows no Secret at all: a caller that forgets the install config connects nowhere.
    """

    listed: frozenset[tuple[str, str]] = frozenset()
    ca_file: str | None = None
    cleartext_shards: frozenset[str] = frozenset()
    bindings: Mapping[tuple[str, str], EndpointBinding] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: InstallConfig, ca_file: str | None = None) -> AdminPolicy:
        """shardSecrets, and the mounted shardTLS.caBundle (`ca_file` overrides the path outside a pod)."""
        if ca_file is None and config.shard_tls.ca_bundle is not None:
            ca_file = SHARD_CA_FILE
        return cls(
            frozenset((ref.namespace, ref.name) for ref in config.shard_secrets),
            ca_file,
            frozenset(config.shard_tls.cleartext_shards),
            {
                (ref.namespace, ref.name): EndpointBinding(ref.host, ref.port)
                for ref in config.shard_secrets
                if ref.host is not None or ref.port is not None
            },
        )

    def check(self, shard: str, spec: ShardSpec) -> None:
        """AdminRefused unless the Shard's admin Secret is listed and its sslmode keeps TLS on."""
        ref = spec.admin.secret_ref
        if (ref.namespace, ref.name) not in self.listed:
            raise AdminSecretInvalid(
                f"admin Secret {ref.namespace}/{ref.name} is not listed in the install's shardSecrets; "
                "it is not read and no connection is made"
            )
        refusal = tls_refusal(shard, spec.admin.sslmode, self.cleartext_shards)
        if refusal is not None:
            raise AdminTlsRequired(f"{refusal}; no connection is made")

    def check_binding(self, spec: ShardSpec, values: Mapping[str, str]) -> None:
        """AdminEndpointMismatch unless the Shard's admin endpoint is the one its Secret is bound to."""
        ref = spec.admin.secret_ref
        binding = bound_endpoint(self.bindings.get((ref.namespace, ref.name)), values) or EndpointBinding()
        refusal = binding.refusal(f"{ref.namespace}/{ref.name}", spec.admin_host, spec.admin.port)
        if refusal is not None:
            raise AdminEndpointMismatch(f"{refusal}; no connection is made")

    def sslrootcert(self, sslmode: str) -> str | None:
        """The CAs that verify the server: the CA bundle, else the system trust store (verify-* only).

        Weaker modes get none: libpq would otherwise turn `require` into verify-ca whenever a root
        certificate is given.
        """
        if sslmode not in (SslMode.VERIFY_CA, SslMode.VERIFY_FULL):
            return None
        return self.ca_file or "system"


def read_admin_secret(rest: Rest, shard: str, spec: ShardSpec, policy: AdminPolicy) -> tuple[str, str]:
    """(user, password) from the Shard's admin Secret, read from the apiserver now, if the policy
    lets this Shard use it (AdminRefused otherwise)."""
    policy.check(shard, spec)
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
    policy.check_binding(spec, values)
    return values[ref.user_key], values[ref.password_key]


def admin_endpoint(
    rest: Rest, shard: str, spec: ShardSpec, policy: AdminPolicy, host_override: str | None = None
) -> AdminEndpoint:
    """Where and as whom to run DDL on this shard (AdminRefused when the policy forbids it).

    `host_override` replaces the in-cluster Service DNS name (kept: each shard's port) and exists
    for running the manager outside a cluster (`dbprovider dev`, tests); the Secret's binding is
    checked against the Shard's own admin endpoint.
    """
    user, password = read_admin_secret(rest, shard, spec, policy)
    sslmode = str(spec.admin.sslmode)
    return AdminEndpoint(
        host=host_override or spec.admin_host,
        port=spec.admin.port,
        user=user,
        password=password,
        sslmode=sslmode,
        sslrootcert=policy.sslrootcert(sslmode),
        cleartext_allowed=shard in policy.cleartext_shards,
    )


ADMIN_ENDPOINT_TTL = 10.0


@dataclass(eq=False)
class AdminEndpointCache:
    """Each shard's admin endpoint as last read, reused for `ttl` seconds (errors are not kept).

    A rotated admin Secret reaches the Database workers within `ttl` (well within the 60 s in which
    the Shard must show it), and at once after a failed operation: the caller `forget`s the shard, so the retry
    reads the Secret again. A change of the Shard's admin block (another Secret, host or port)
    is a different key and is read at once.
    """

    rest: Rest
    policy: AdminPolicy
    host_override: str | None = None
    ttl: float = ADMIN_ENDPOINT_TTL
    clock: Callable[[], float] = time.monotonic
    reads: int = field(default=0, init=False)  # how often the Secret was read (what the cache saves, in tests)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _entries: dict[str, tuple[str, float, AdminEndpoint]] = field(default_factory=dict, init=False, repr=False)

    def get(self, shard: str, spec: ShardSpec) -> AdminEndpoint:
        """The endpoint of `shard`; AdminRefused or ApiException when its Secret cannot be used."""
        key = spec.admin.model_dump_json() + (self.host_override or spec.admin_host)
        now = self.clock()
        with self._lock:
            entry = self._entries.get(shard)
        if entry is not None and entry[0] == key and now - entry[1] < self.ttl:
            return entry[2]
        endpoint = admin_endpoint(self.rest, shard, spec, self.policy, self.host_override)
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
    """Reusable AdminSessions, reopened when the endpoint changes: one per (lane slot, shard) for a
    worker that holds a lane slot (the Database workers: a shard never has more sessions of ours than
    its lane has slots, `workersPerShard`), else one per (thread, shard) (the Shard workers).

    `fence` (leadership, from the composition root) is checked before every statement of every
    session handed out; `application_name` names this replica in the shards' logs and activity.
    `links` is what the Shard controller learnt about each shard: a session's connect timeout is
    the shard check's, and while the shard is not answering no session to it is opened (`gate`).
    `abort(shard)` cuts every session to a shard, from any thread. `on_slow(shard)` is called when
    an operation on a shard has waited `suspect_after` seconds (the Shard controller's
    `ShardSuspects`: it checks the shard now).
    """

    def __init__(
        self,
        connect_timeout: float = SETTINGS.sql.connect_timeout,
        *,
        fence: Fence | None = None,
        application_name: str = APPLICATION_NAME,
        links: ShardLinks | None = None,
        on_slow: Callable[[str], None] | None = None,
    ) -> None:
        self._local = threading.local()
        self._connect_timeout = connect_timeout
        self.fence = fence
        self.application_name = application_name
        self.links = links or ShardLinks()
        self.on_slow = on_slow
        self._all: dict[AdminSession, str] = {}  # every session of every thread -> its shard
        self._by_slot: dict[Slot, dict[str, _Entry]] = {}  # a slot is held by one worker at a time
        self._lock = threading.Lock()

    @staticmethod
    def _fingerprint(endpoint: AdminEndpoint) -> str:
        fields = [endpoint.host, str(endpoint.port), endpoint.user, endpoint.password, endpoint.sslmode]
        fields.append("cleartext" if endpoint.cleartext_allowed else "tls")
        raw = "\0".join([*fields, endpoint.sslrootcert or ""])
        return hashlib.sha256(raw.encode()).hexdigest()

    def _mine(self) -> dict[str, _Entry]:
        """The caller's sessions by shard: its lane slot's, or its thread's."""
        slot = current_slot()
        if slot is None:
            mine: dict[str, _Entry] = self._local.__dict__.setdefault("sessions", {})
            return mine
        with self._lock:
            return self._by_slot.setdefault(slot, {})

    def get(self, shard: str, endpoint: AdminEndpoint) -> AdminSession:
        sessions = self._mine()
        fingerprint = self._fingerprint(endpoint)
        entry = sessions.get(shard)
        if entry is None or entry.fingerprint != fingerprint:
            if entry is not None:
                entry.session.close()
                self._forget(entry.session)
            entry = _Entry(fingerprint, self._worker_session(shard, endpoint))
            sessions[shard] = entry
            with self._lock:
                self._all[entry.session] = shard
        # The shard check's connect bound, as learnt so far (a slow link gets more time).
        entry.session.connect_timeout = min(self._connect_timeout, self.links.timeouts(shard).connect)
        return entry.session

    def _worker_session(self, shard: str, endpoint: AdminEndpoint) -> AdminSession:
        session = self.one_off(endpoint, self._connect_timeout)
        session.gate = lambda: self._refusal(shard)
        session.on_slow = lambda: self._slow(shard)
        return session

    def _refusal(self, shard: str) -> str | None:
        why = self.links.not_answering(shard)
        return None if why is None else f"shard {shard} is not answering ({why})"

    def _slow(self, shard: str) -> None:
        if self.on_slow is not None:
            self.on_slow(shard)

    def one_off(self, endpoint: AdminEndpoint, connect_timeout: float) -> AdminSession:
        """A new session of its own (fenced and named like the others); the caller closes it."""
        return AdminSession.for_endpoint(
            endpoint, application_name=self.application_name, connect_timeout=connect_timeout, fence=self.fence
        )

    def abort(self, shard: str) -> int:
        """Cut every session to `shard` (any worker's): work blocked on it fails at once. Returns how many."""
        with self._lock:
            doomed = [session for session, of in self._all.items() if of == shard]
        for session in doomed:
            session.sever()
        return len(doomed)

    def sever_all(self) -> None:
        """Cut every session's socket (the controllers are stopping): a worker blocked on one returns
        at once, and the shard sees the session end now, not when the worker is done."""
        with self._lock:
            sessions = list(self._all)
        for session in sessions:
            session.sever()

    def close_all(self) -> None:
        """Close every session (the controllers have stopped): no connection outlives a leader term."""
        with self._lock:
            sessions, self._all = list(self._all), {}
            self._by_slot.clear()
        for session in sessions:
            session.sever()  # a worker still blocked on one returns at once
            session.close()

    def drop(self, shard: str) -> None:
        entry = self._mine().pop(shard, None)
        if entry is not None:
            entry.session.close()
            self._forget(entry.session)

    def _forget(self, session: AdminSession) -> None:
        with self._lock:
            self._all.pop(session, None)


parse_shard_spec = parse_shard  # the name the Database controller imports until the merge
