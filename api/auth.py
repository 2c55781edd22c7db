"""Bearer-token authentication of consumers.

`TokenIndex` maps sha256(token) -> consumer name. It is built from the Consumer objects and their token
Secrets (release namespace only) and kept current by informer handlers, so a change to a Consumer or to
its Secret takes effect without a restart. The token Secrets come from one metadata-only watch of the
release namespace plus a GET of a named Secret when it changes (`informers.NamedObjects`): one watch
whatever the number of consumers, and no other Secret's data in memory. A shard admin Secret listed in
shardSecrets is never read, even when a Consumer names it. A lookup is one dict access (O(1) in the
number of consumers) followed by a constant-time comparison of the digests.

A consumer authenticates only in state OK: enabled, a valid spec, its tokenSecretRef in the release
namespace, and its Secret holding at least one hash under the key. Every other case ends in the same
bare 401 (`AuthMiddleware`); the causes go to the log, never to the caller.

Conflicts. A hash listed by two consumers authenticates neither, in every state of either: what a
consumer lists is read from the Secret it names whatever its state (disabled, an invalid spec with a
valid ref), and where the ref cannot be followed as written the provider reads what it can in its place,
so that breaking one consumer's configuration never hands a shared hash to the other:
- the key is missing: every hash of that Secret, under any key, counts as listed;
- the ref points outside the release namespace (which the provider cannot read): the Secret of the same
  name in the release namespace counts as listed (a ref moved out by mistake keeps its hashes denied).
A conflict is logged once when it starts (a token stopped authenticating) and once when it ends.

Nothing here logs, returns or counts a token or a hash: logs name consumers and Secrets, and give the
number of ignored lines of a Secret, never their content.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import falcon
from pydantic import ValidationError

from api.admission import AUTHENTICATED_HOOK
from api.errors import TooManyRequests, Unauthorized, Unavailable
from domain.constants import NOT_PROVIDER_MANAGED_SELECTOR
from domain.credentials import secret_data_bytes, secret_data_values
from domain.metadata import ObjectMeta, object_name
from domain.objects import consumer_disabled
from domain.resources import CONSUMERS
from domain.specs import TokenSecretRef, parse_consumer, parse_token_secret_ref
from domain.tokens import TokenHashes, hash_token, parse_token_hashes
from informers import SECRETS, Informer, SharedInformers
from informers.informer import Handler

log = logging.getLogger(__name__)

# Consumers by the name of the Secret their tokenSecretRef names (read in the release namespace).
INDEX_TOKEN_SECRET = "api:token-secret"

# RFC 6750 b64token after the case-insensitive scheme; anything else is a malformed header.
_BEARER_RE = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9._~+/-]+=*) *")
MAX_TOKEN_LENGTH = 4096


def token_secret_names(consumer: dict[str, Any]) -> list[str]:
    """Index function: the name of the Secret a Consumer's tokenSecretRef names (if the ref is valid)."""
    ref = parse_token_secret_ref(consumer)
    return [ref.name] if ref is not None else []


def parse_bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None if absent or malformed."""
    if not header or len(header) > MAX_TOKEN_LENGTH + 16:
        return None
    match = _BEARER_RE.fullmatch(header)
    return match.group(1) if match else None


class TokenSecrets(Protocol):
    """The token Secrets of the release namespace the index reads (a `NamedObjects` in the manager)."""

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
    ADMIN_SECRET = "tokenSecretRef names a shard admin Secret (shardSecrets), which is never read"
    SECRET_MISSING = "token Secret is missing"
    KEY_MISSING = "token Secret has no such key (or it is not base64)"
    NO_HASHES = "token Secret key holds no valid SHA-256 hash"


_NO_HASHES = TokenHashes(hashes=frozenset(), ignored_lines=0)


@dataclass(frozen=True)
class _Entry:
    state: AuthState
    hashes: TokenHashes  # what authenticates it (empty unless OK)
    listed: frozenset[str]  # what it lists, whatever its state: these conflict with other consumers


class TokenIndex:
    """sha256(token) -> consumer, from the Consumer and Secret caches (see the module docstring)."""

    def __init__(
        self, consumers: Informer, secrets: TokenSecrets, namespace: str, admin_secrets: Iterable[str] = ()
    ) -> None:
        self.consumers = consumers
        self.secrets = secrets
        self.namespace = namespace
        self.admin_secrets = frozenset(admin_secrets)  # shardSecrets names in the release namespace
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._owners: dict[str, set[str]] = {}  # hash -> consumers that list it (in any state)
        self._conflicts: Counter[frozenset[str]] = Counter()  # consumers listing a common hash -> how many
        self._conflicts_logged: set[frozenset[str]] = set()
        self._built = False
        # "Log once" bookkeeping: bounded by the number of consumers / Secrets.
        self._foreign_logged: dict[str, Any] = {}  # consumer -> generation warned about
        self._ignored_logged: dict[tuple[str, str], str | None] = {}  # (secret, data key) -> resourceVersion
        consumers.add_index(INDEX_TOKEN_SECRET, token_secret_names)
        secrets.add_handler(self._on_secret)
        consumers.add_handler(self._on_consumer)

    @classmethod
    def register(cls, informers: SharedInformers, namespace: str, admin_secrets: Iterable[str] = ()) -> TokenIndex:
        """Create the index on the process' shared informers: Consumers (cluster), and exactly the token
        Secrets they name (release namespace: one metadata watch of the Secrets the provider does not
        manage, and a GET per named Secret). `admin_secrets`: the shardSecrets names in `namespace`."""
        secrets = informers.named(SECRETS, namespace, label_selector=NOT_PROVIDER_MANAGED_SELECTOR)
        return cls(informers.informer(CONSUMERS), secrets, namespace, admin_secrets)

    # -- readiness -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """True once both caches have listed (and read every named Secret) and the index is built."""
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
        """Re-evaluate every consumer from the caches (the index is a pure function of them).

        The first build logs every consumer that cannot authenticate, and a count: states seen before
        it (while the Secrets are still being read) are not logged."""
        with self._lock:
            names = set(self._entries) | {object_name(c) for c in self.consumers.list()}
            for name in names:
                if name:
                    self._recompute(name)
            if not self._built:
                self._built = True
                refused = {n: e.state for n, e in self._entries.items() if e.state is not AuthState.OK}
                for name, state in sorted(refused.items()):
                    if state is not AuthState.FOREIGN_NAMESPACE:  # that one has its own warning
                        level = logging.INFO if state is AuthState.DISABLED else logging.WARNING
                        log.log(level, "consumer %s: authentication state: %s", name, state.value)
                log.info(
                    "token index built: %d consumers, %d of them can authenticate",
                    len(self._entries),
                    len(self._entries) - len(refused),
                )
            self._log_conflicts()

    # -- lookups ---------------------------------------------------------------------------------

    def authenticate(self, token: str) -> str | None:
        """The consumer whose Secret lists sha256(token), or None (unknown, ambiguous or not allowed)."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        digest = hash_token(token)
        with self._lock:
            owners = self._owners.get(digest)
            if not owners or len(owners) != 1:  # unknown, or listed by several consumers (in any state)
                return None
            (name,) = owners
            entry = self._entries.get(name)
        if entry is None or entry.state is not AuthState.OK or not entry.hashes.matches(digest):
            return None
        # The handler may lag the cache by an instant: re-check the consumer itself.
        consumer = self.consumers.get(name)
        if consumer is None or consumer_disabled(consumer):
            return None
        return name

    def state(self, consumer: str) -> AuthState | None:
        """Why a consumer can or cannot authenticate (for tests and diagnostics)."""
        with self._lock:
            entry = self._entries.get(consumer)
            return entry.state if entry is not None else None

    # -- maintenance -----------------------------------------------------------------------------

    def _want_secrets(self) -> None:
        """Cache the token Secrets the Consumers name now (whatever namespace their refs give: see the
        module docstring), never a shard admin Secret."""
        self.secrets.want(set(self.consumers.index_values(INDEX_TOKEN_SECRET)) - self.admin_secrets)

    def _on_consumer(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._want_secrets()
        name = object_name(new if new is not None else old or {})
        if name:
            with self._lock:
                self._recompute(name)
                self._log_conflicts()

    def _on_secret(self, event_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        secret = new if new is not None else old
        if secret is None:
            return
        with self._lock:
            for consumer in self.consumers.by_index(INDEX_TOKEN_SECRET, object_name(secret) or ""):
                name = object_name(consumer)
                if name:
                    self._recompute(name)
            self._log_conflicts()

    def _recompute(self, name: str) -> None:
        """Evaluate one consumer from the current caches and update the index (caller holds the lock)."""
        consumer = self.consumers.get(name)
        entry = self._evaluate(name, consumer) if consumer is not None else None
        previous = self._entries.pop(name, None)
        for digest in previous.listed if previous is not None else ():
            self._set_owner(digest, name, False)
        if entry is None:
            self._foreign_logged.pop(name, None)
            if previous is not None:
                log.info("consumer %s removed from the token index", name)
            return
        self._entries[name] = entry
        for digest in entry.listed:
            self._set_owner(digest, name, True)
        changed = previous is None or previous.state is not entry.state
        if self._built and changed and entry.state is not AuthState.FOREIGN_NAMESPACE:
            level = logging.INFO if entry.state in (AuthState.OK, AuthState.DISABLED) else logging.WARNING
            log.log(level, "consumer %s: authentication state: %s", name, entry.state.value)

    def _set_owner(self, digest: str, name: str, listed: bool) -> None:
        """Add or remove one consumer as an owner of `digest`, keeping the conflict counts current."""
        owners = self._owners.setdefault(digest, set())
        if len(owners) > 1:
            self._conflicts[frozenset(owners)] -= 1
        (owners.add if listed else owners.discard)(name)
        if len(owners) > 1:
            self._conflicts[frozenset(owners)] += 1
        elif not owners:
            del self._owners[digest]

    def _log_conflicts(self) -> None:
        """Log each set of consumers with a common hash once when it appears and once when it is gone
        (from the first build on)."""
        current = {names for names, count in self._conflicts.items() if count > 0}
        self._conflicts = Counter({names: self._conflicts[names] for names in current})
        if not self._built:
            return
        for names in sorted(current - self._conflicts_logged, key=sorted):
            states = ", ".join(f"{n} ({self._entries[n].state.value})" for n in sorted(names))
            log.warning(
                "a token stopped authenticating: the same token hash is listed by consumers %s; "
                "none of them authenticates with it until it is removed from all but one",
                states,
            )
        for names in sorted(self._conflicts_logged - current, key=sorted):
            log.info("consumers %s no longer list a common token hash", ", ".join(sorted(names)))
        self._conflicts_logged = current

    def _listed(self, ref: TokenSecretRef | None) -> frozenset[str]:
        """The hashes a consumer with this ref lists, for conflicts (see the module docstring)."""
        if ref is None or ref.name in self.admin_secrets:
            return frozenset()
        secret = self.secrets.get(ref.name)
        if secret is None:
            return frozenset()
        raw = secret_data_bytes(secret, ref.key)
        if raw is not None:
            return parse_token_hashes(raw).hashes
        found: set[str] = set()
        for value in secret_data_values(secret).values():  # the key is missing: any key may be the one meant
            found |= parse_token_hashes(value).hashes
        return frozenset(found)

    def _evaluate(self, name: str, consumer: dict[str, Any]) -> _Entry:
        listed = self._listed(parse_token_secret_ref(consumer))
        try:
            spec = parse_consumer(consumer)
        except ValidationError:
            return _Entry(AuthState.INVALID_SPEC, _NO_HASHES, listed)
        if spec.disabled:
            return _Entry(AuthState.DISABLED, _NO_HASHES, listed)
        ref = spec.token_secret_ref
        if ref.namespace != self.namespace:
            self._warn_foreign(name, consumer, ref)
            return _Entry(AuthState.FOREIGN_NAMESPACE, _NO_HASHES, listed)
        self._foreign_logged.pop(name, None)
        if ref.name in self.admin_secrets:
            return _Entry(AuthState.ADMIN_SECRET, _NO_HASHES, listed)
        secret = self.secrets.get(ref.name)
        if secret is None:
            return _Entry(AuthState.SECRET_MISSING, _NO_HASHES, listed)
        raw = secret_data_bytes(secret, ref.key)
        if raw is None:
            return _Entry(AuthState.KEY_MISSING, _NO_HASHES, listed)
        hashes = parse_token_hashes(raw)
        if hashes.ignored_lines:
            version = ObjectMeta.of(secret).resource_version
            secret_key = f"{self.namespace}/{ref.name}"
            if self._ignored_logged.get((secret_key, ref.key)) != version:
                self._ignored_logged[(secret_key, ref.key)] = version
                log.warning(
                    "Secret %s key %s: ignored %d line(s) that are not a SHA-256 hex digest",
                    secret_key,
                    ref.key,
                    hashes.ignored_lines,
                )
        if not hashes.hashes:
            return _Entry(AuthState.NO_HASHES, _NO_HASHES, listed)
        return _Entry(AuthState.OK, hashes, listed)

    def _warn_foreign(self, name: str, consumer: dict[str, Any], ref: TokenSecretRef) -> None:
        """Once per Consumer generation: its ref points outside the release namespace."""
        generation = ObjectMeta.of(consumer).generation
        if self._foreign_logged.get(name, object()) == generation:
            return
        self._foreign_logged[name] = generation
        log.warning(
            "consumer %s (generation %s): tokenSecretRef namespace %s is not the release namespace %s; "
            "it never authenticates",
            name,
            generation,
            ref.namespace,
            self.namespace,
        )


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
