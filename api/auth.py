"""Bearer-token authentication of consumers.

`TokenIndex` maps sha256(token) -> consumer name. It is built from the Consumer objects and their token
Secrets (release namespace only) and kept current by informer handlers, so a change to a Consumer or to
its Secret takes effect without a restart. Token Secrets are cached by name, one watch per name the
Consumers reference (`TokenSecrets`): no other Secret of the release namespace enters this cache. A
lookup is one dict access (O(1) in the number of consumers) followed by a constant-time comparison of
the digests.

A consumer contributes no hash at all, and so can never authenticate, when it is disabled, its
tokenSecretRef points outside the release namespace, its Secret or key is missing, or its spec is invalid.
A hash configured on two consumers authenticates neither. Every one of these cases ends in the same
bare 401 (`AuthMiddleware`); the causes go to the log, never to the caller.

Nothing here logs, returns or counts a token or a hash: logs name consumers and Secrets, and give the
number of ignored lines of a Secret, never their content.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import falcon
from pydantic import ValidationError

from api.admission import AUTHENTICATED_HOOK
from api.errors import TooManyRequests, Unauthorized, Unavailable
from api.kube import CONSUMERS, SECRETS, metadata
from domain.credentials import secret_data_bytes
from domain.specs import parse_consumer
from domain.tokens import TokenHashes, hash_token, parse_token_hashes
from informers import Informer, NamedInformers, SharedInformers, object_key
from informers.informer import Handler

log = logging.getLogger(__name__)

# Consumers by the Secret their tokenSecretRef names ("namespace/name"), to re-evaluate them on a change.
INDEX_TOKEN_SECRET = "api:token-secret"

# RFC 6750 b64token after the case-insensitive scheme; anything else is a malformed header.
_BEARER_RE = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9._~+/-]+=*) *")
MAX_TOKEN_LENGTH = 4096


def token_secret_keys(consumer: dict[str, Any]) -> list[str]:
    """Index function: the "namespace/name" of the Secret a Consumer's tokenSecretRef names."""
    ref = (consumer.get("spec") or {}).get("tokenSecretRef")
    if not isinstance(ref, dict):
        return []
    namespace, name = ref.get("namespace"), ref.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return []
    return [f"{namespace}/{name}"]


def parse_bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None if absent or malformed."""
    if not header or len(header) > MAX_TOKEN_LENGTH + 16:
        return None
    match = _BEARER_RE.fullmatch(header)
    return match.group(1) if match else None


class TokenSecrets(Protocol):
    """The token Secrets of the release namespace the index reads (a `NamedInformers` in the manager)."""

    def want(self, names: Iterable[str]) -> None: ...

    def add_handler(self, handler: Handler) -> object: ...

    def get(self, name: str) -> dict[str, Any] | None: ...

    def has_synced(self) -> bool: ...


class AuthState(enum.StrEnum):
    """Why a consumer can or cannot authenticate (logged on change, never returned to callers)."""

    OK = "ok"
    DISABLED = "disabled"
    INVALID_SPEC = "spec is invalid"
    FOREIGN_NAMESPACE = "tokenSecretRef is outside the release namespace"
    SECRET_MISSING = "token Secret is missing"
    KEY_MISSING = "token Secret has no such key (or it is not base64)"
    NO_HASHES = "token Secret key holds no valid SHA-256 hash"


_NO_HASHES = TokenHashes(hashes=frozenset(), ignored_lines=0)


@dataclass(frozen=True)
class _Entry:
    state: AuthState
    hashes: TokenHashes


class TokenIndex:
    """sha256(token) -> consumer, from the Consumer and Secret informers (see the module docstring)."""

    def __init__(self, consumers: Informer, secrets: TokenSecrets, namespace: str) -> None:
        self.consumers = consumers
        self.secrets = secrets
        self.namespace = namespace
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._owners: dict[str, set[str]] = {}  # hash -> consumers that list it
        self._built = False
        # "Log once" bookkeeping: bounded by the number of consumers / Secrets.
        self._foreign_logged: dict[str, Any] = {}  # consumer -> generation warned about
        self._ignored_logged: dict[tuple[str, str], str | None] = {}  # (secret key, data key) -> resourceVersion
        self._conflicts_logged: set[frozenset[str]] = set()
        consumers.add_index(INDEX_TOKEN_SECRET, token_secret_keys)
        secrets.add_handler(self._on_secret)
        consumers.add_handler(self._on_consumer)

    @classmethod
    def register(cls, informers: SharedInformers, namespace: str) -> TokenIndex:
        """Create the index on the process' shared informers: Consumers (cluster), and exactly the
        token Secrets they name (release namespace, one field-selected informer per name)."""
        return cls(informers.informer(CONSUMERS), NamedInformers(informers, SECRETS, namespace), namespace)

    # -- readiness -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """True once both informers have listed and the index has been built from them."""
        if self._built:
            return True
        if not self.consumers.has_synced():
            return False
        self._want_secrets()
        if not self.secrets.has_synced():
            return False
        self.rebuild()
        return True

    def rebuild(self) -> None:
        """Re-evaluate every consumer from the caches (the index is a pure function of them)."""
        with self._lock:
            names = set(self._entries) | {metadata(c).get("name") for c in self.consumers.list()}
            for name in names:
                if name:
                    self._recompute(name)
            self._built = True

    # -- lookups ---------------------------------------------------------------------------------

    def authenticate(self, token: str) -> str | None:
        """The consumer whose Secret lists sha256(token), or None (unknown, ambiguous or not allowed)."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        digest = hash_token(token)
        with self._lock:
            owners = self._owners.get(digest)
            if not owners or len(owners) != 1:  # unknown, or the same hash on several consumers
                return None
            (name,) = owners
            entry = self._entries.get(name)
        if entry is None or entry.state is not AuthState.OK or not entry.hashes.matches(digest):
            return None
        # The handler may lag the cache by an instant: re-check the consumer itself.
        consumer = self.consumers.get(name)
        if consumer is None or (consumer.get("spec") or {}).get("disabled") is True:
            return None
        return name

    def state(self, consumer: str) -> AuthState | None:
        """Why a consumer can or cannot authenticate (for tests and diagnostics)."""
        with self._lock:
            entry = self._entries.get(consumer)
            return entry.state if entry is not None else None

    # -- maintenance -----------------------------------------------------------------------------

    def _want_secrets(self) -> None:
        """Cache the token Secrets the Consumers name now (never under self._lock: see NamedInformers)."""
        prefix = f"{self.namespace}/"
        self.secrets.want(
            key[len(prefix) :] for key in self.consumers.index_values(INDEX_TOKEN_SECRET) if key.startswith(prefix)
        )

    def _on_consumer(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._want_secrets()
        name = metadata(new if new is not None else old or {}).get("name")
        if name:
            with self._lock:
                self._recompute(name)

    def _on_secret(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        secret = new if new is not None else old
        if secret is None:
            return
        key = object_key(secret)
        with self._lock:
            for consumer in self.consumers.by_index(INDEX_TOKEN_SECRET, key):
                name = metadata(consumer).get("name")
                if name:
                    self._recompute(name)

    def _recompute(self, name: str) -> None:
        """Evaluate one consumer from the current caches and update the index (caller holds the lock)."""
        consumer = self.consumers.get(name)
        entry = self._evaluate(name, consumer) if consumer is not None else None
        previous = self._entries.pop(name, None)
        if previous is not None:
            for digest in previous.hashes.hashes:
                owners = self._owners.get(digest)
                if owners is not None:
                    owners.discard(name)
                    if not owners:
                        del self._owners[digest]
        if entry is None:
            self._foreign_logged.pop(name, None)
            if previous is not None:
                log.info("consumer %s removed from the token index", name)
            return
        self._entries[name] = entry
        conflicts: set[frozenset[str]] = set()
        for digest in entry.hashes.hashes:
            owners = self._owners.setdefault(digest, set())
            owners.add(name)
            if len(owners) > 1:
                conflicts.add(frozenset(owners))
        changed = previous is None or previous.state is not entry.state
        if changed and entry.state is not AuthState.FOREIGN_NAMESPACE:  # that one has its own warning
            level = logging.INFO if entry.state in (AuthState.OK, AuthState.DISABLED) else logging.WARNING
            log.log(level, "consumer %s: authentication state: %s", name, entry.state.value)
        for names in conflicts - self._conflicts_logged:
            log.warning(
                "the same token hash is configured on consumers %s: none of them authenticates with it",
                ", ".join(sorted(names)),
            )
        self._conflicts_logged = {c for c in self._conflicts_logged | conflicts if self._still_conflicting(c)}

    def _still_conflicting(self, names: frozenset[str]) -> bool:
        entries = [self._entries.get(n) for n in names]
        if any(e is None for e in entries):
            return False
        common = frozenset.intersection(*(e.hashes.hashes for e in entries if e is not None))
        return bool(common)

    def _evaluate(self, name: str, consumer: dict[str, Any]) -> _Entry:
        try:
            spec = parse_consumer(consumer)
        except ValidationError:
            return _Entry(AuthState.INVALID_SPEC, _NO_HASHES)
        if spec.disabled:
            return _Entry(AuthState.DISABLED, _NO_HASHES)
        ref = spec.token_secret_ref
        if ref.namespace != self.namespace:
            generation = metadata(consumer).get("generation")
            if self._foreign_logged.get(name, object()) != generation:
                self._foreign_logged[name] = generation
                log.warning(
                    "consumer %s (generation %s): tokenSecretRef namespace %s is not the release namespace %s; "
                    "it never authenticates",
                    name,
                    generation,
                    ref.namespace,
                    self.namespace,
                )
            return _Entry(AuthState.FOREIGN_NAMESPACE, _NO_HASHES)
        self._foreign_logged.pop(name, None)
        secret_key = f"{self.namespace}/{ref.name}"
        secret = self.secrets.get(ref.name)
        if secret is None:
            return _Entry(AuthState.SECRET_MISSING, _NO_HASHES)
        raw = secret_data_bytes(secret, ref.key)
        if raw is None:
            return _Entry(AuthState.KEY_MISSING, _NO_HASHES)
        hashes = parse_token_hashes(raw)
        if hashes.ignored_lines:
            version = metadata(secret).get("resourceVersion")
            if self._ignored_logged.get((secret_key, ref.key)) != version:
                self._ignored_logged[(secret_key, ref.key)] = version
                log.warning(
                    "Secret %s key %s: ignored %d line(s) that are not a SHA-256 hex digest",
                    secret_key,
                    ref.key,
                    hashes.ignored_lines,
                )
        if not hashes.hashes:
            return _Entry(AuthState.NO_HASHES, _NO_HASHES)
        return _Entry(AuthState.OK, hashes)


class AuthMiddleware:
    """Authenticates every request to a resource whose `auth_required` is not False.

    The consumer's name goes to `req.context.consumer`, and to the front door's hook (its bounds per
    consumer: 429 when the consumer has too many requests in progress). Any failure raises
    `Unauthorized` (the same bare 401 whatever the cause); before the caches are synced the answer is 503.
    """

    def __init__(self, tokens: TokenIndex) -> None:
        self.tokens = tokens

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.consumer = None

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict[str, Any]
    ) -> None:
        if resource is None or not getattr(resource, "auth_required", True):
            return
        if not self.tokens.ready():
            raise Unavailable("the provider is starting; try again shortly")
        token = parse_bearer(req.get_header("Authorization"))
        consumer = self.tokens.authenticate(token) if token is not None else None
        if consumer is None:
            raise Unauthorized()
        req.context.consumer = consumer
        bound = req.env.get(AUTHENTICATED_HOOK)  # the front door's per-consumer bound (api/admission.py)
        if bound is not None and not bound(consumer):
            raise TooManyRequests()
