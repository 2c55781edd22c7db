"""The Database's credentials Secret: created before the role (the source of its password),
endpoint keys kept equal to the Shard's client block, never overwritten when it is not ours."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.constants import CREDENTIALS_SECRET_SUFFIX, DatabaseReason, Phase
from domain.credentials import (
    Endpoint,
    SecretState,
    build_secret,
    classify_secret,
    credentials_labels,
    endpoint_patch,
    is_digested,
    new_password,
    password_id,
    secret_settled,
    secret_values,
)
from domain.metadata import ObjectMeta
from domain.naming import credentials_secret_name
from informers import SECRETS, Informer, Rest, object_key
from informers.informer import resource_version_of
from reconciler.database.report import Reporter
from reconciler.database.state import Database
from reconciler.database.writes import conditional
from reconciler.runtime import ensure_active

Secret = dict[str, Any]

# How long a Secret we created is used while the cache does not show it (its event is normally in
# within milliseconds); after that the cache rules again.
REMEMBER_CREATED = 10.0
REMEMBER_PRUNE_AT = 4096


def secret_name(database: Database) -> str:
    return credentials_secret_name(database.name)


def password(secret: Secret) -> str:
    """The password of a Secret read from the apiserver (a cached one holds none: ValueError)."""
    return secret_values(secret)["password"]


def user(secret: Secret) -> str:
    """The login role of a Secret read from the apiserver: the tenant role, or its alternate."""
    return secret_values(secret)["user"]


def password_pending(database: Database, secret: Secret) -> bool:
    """The Secret holds a password that may not be set on the role yet."""
    current = password_id(secret)
    return current is not None and current != database.status.password_applied


def password_applied(database: Database, secret: Secret) -> None:
    """Record (with the next status write) that the Secret's password is the role's."""
    current = password_id(secret)
    if current is not None:
        database.update(password_applied=current)


@dataclass
class CredentialsSecrets:
    """Reads (from the label-selected cache, or live), creates, labels and deletes credentials Secrets.

    A Secret this replica created is kept (`_created`) until its watch event is in the cache: the
    placement pass creates it (after its placement is written) and the shard's pass, which may start
    before the event, uses it instead of creating it again (a 409 and a GET). That event itself
    (`own_create`) needs no pass of its Database: the pass that created it holds it, and the next
    pass comes anyway. Without this the event re-queued the key behind the pass running it, and where
    the shard's lane was idle the re-queued pass ran before the Ready write's event,
    found the cache behind it and scheduled one more: 4.6 passes per new database instead of 3.

    The event may also come while the create is still in flight (before its answer): it is held
    (`_creating`) and, once the answer is in, dropped if it was the create's own version, else its
    pass is queued after all (`enqueue`, the Database controller's queue).
    """

    rest: Rest
    secrets: Informer
    report: Reporter
    enqueue: Callable[[str], None] | None = None  # the Database controller's queue (its Wakeups)
    # Secret key -> (the Secret as our create returned it, time.monotonic() of the create)
    _created: dict[str, tuple[Secret, float]] = field(default_factory=dict)
    # Secret key -> the resourceVersion of a cached Secret whose event came while our create was in flight
    _creating: dict[str, str | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def own_create(self, secret: Secret) -> bool:
        """True (once) when `secret` is the cached Secret exactly as this replica created it: the event
        echoes our own write. A deletion's event (the cache no longer holds it) is never one."""
        if not self._created and not self._creating:
            return False  # the common case (no create in flight): no look at the object at all
        key, version = object_key(secret), resource_version_of(secret)
        with self._lock:
            if key in self._creating:
                stored = self.secrets.get(key)
                if stored is None or version is None or resource_version_of(stored) != version:
                    return False  # a deletion, or not the cache's state: a pass as always
                self._creating[key] = version  # decided once the create's answer is in (`_create`)
                return True
            created = self._created.get(key)
            if created is None:
                return False
            stored = self.secrets.get(key)
            if stored is None or resource_version_of(stored) != resource_version_of(created[0]):
                # The cache moved past our create (the Secret was deleted or changed since): it rules now.
                # Kept, the create would mask a deletion made within REMEMBER_CREATED (see `_remembered`).
                del self._created[key]
                return False
            if version != resource_version_of(created[0]):
                return False
            del self._created[key]
            return True

    def _create(self, key: str, body: Secret, namespace: str) -> Secret | None:
        """Create the Secret `key` (None: it exists already, 409), holding its event while in flight."""
        ensure_active()
        with self._lock:
            self._creating[key] = None
        created: Secret | None = None
        try:
            created = self.rest.create(SECRETS, body, namespace)
        except ApiException as exc:
            if exc.status != 409:
                raise
        finally:
            version = resource_version_of(created) if created is not None else None
            with self._lock:  # one step: an event between the two finds the create in one of them
                arrived = self._creating.pop(key, None)
                if created is not None and version is not None and arrived != version:
                    self._remember(created)
            if arrived is not None and arrived != version and self.enqueue is not None:
                self.enqueue(key[: -len(CREDENTIALS_SECRET_SUFFIX)])  # held back, not ours: its pass after all
        return created

    def _remember(self, created: Secret) -> None:
        """Keep our create until its event comes (the caller holds `_lock`)."""
        now = time.monotonic()
        stored = self.secrets.get(object_key(created))
        if stored is not None and resource_version_of(stored) == resource_version_of(created):
            return  # its event came before the create's answer: the cache shows it already
        if len(self._created) >= REMEMBER_PRUNE_AT:  # events that never came (a stopped controller)
            self._created = {k: v for k, v in self._created.items() if now - v[1] < REMEMBER_CREATED}
        self._created[object_key(created)] = (created, now)

    def _remembered(self, key: str) -> Secret | None:
        """Our own create of `key`, made less than REMEMBER_CREATED ago (after that the cache rules)."""
        with self._lock:
            created = self._created.get(key)
        if created is None or time.monotonic() - created[1] >= REMEMBER_CREATED:
            return None
        return created[0]

    def cached(self, db: dict[str, Any]) -> Secret | None:
        """The credentials Secret of the Database object `db` as the cache holds it (None if not there)."""
        return self.secrets.get(self.key_of(db))

    @staticmethod
    def key_of(db: dict[str, Any]) -> str:
        """The cache key of the credentials Secret of the Database object `db`."""
        meta = db.get("metadata") or {}
        return f"{meta.get('namespace')}/{credentials_secret_name(str(meta.get('name')))}"

    def ensure(self, database: Database, endpoint: Endpoint, *, values: bool = False) -> Secret:
        """The credentials Secret: created before the role exists; endpoint keys follow the shard.

        The cache holds a Secret's metadata and digest only (domain.cached): one that is current is returned
        as cached, unless the caller needs its `values` (the password, for SQL); any other is read from the
        apiserver first."""
        tenant = database.tenant
        key = f"{database.namespace}/{secret_name(database)}"
        cached, remembered = self.secrets.get(key), self._remembered(key)  # ours, its event not in the cache yet
        secret = cached or remembered
        if remembered is not None and (
            cached is None or resource_version_of(cached) == resource_version_of(remembered)
        ):
            secret = remembered  # our create's answer: the same version, with its data
        if secret is not None and is_digested(secret):
            if not values and secret_settled(secret, database.uid, tenant, endpoint, database.status.login_role):
                return secret
            secret = self._live(database)
        state = classify_secret(secret, database.uid, tenant)
        if state is SecretState.MISSING:
            # Its new password (a new id) is pending until status.passwordApplied names it: the role
            # may exist already (the Secret was deleted, an existing tenant is adopted, or a crash hit
            # between the SQL and the status write), and ensure_tenant leaves a finished tenant's
            # password alone.
            body = build_secret(database.db, tenant, new_password(), endpoint)
            created = self._create(key, body, database.namespace)
            if created is not None:
                return created
            secret, state = self._uncached(database, tenant)
        if state is not SecretState.OURS:
            what = "is not owned by this Database" if state is SecretState.FOREIGN else "is inconsistent"
            raise self.report.failure(
                database,
                database.status.phase or Phase.PROVISIONING,
                DatabaseReason.CREDENTIALS_SECRET_CONFLICT,
                f"Secret {secret_name(database)} {what}; it is never overwritten",
            )
        assert secret is not None
        patch = endpoint_patch(secret, endpoint)
        if patch is not None:
            ensure_active()
            secret = self.rest.patch(SECRETS, secret_name(database), conditional(patch, secret), database.namespace)
        return secret

    def _live(self, database: Database) -> Secret | None:
        """The Secret as the apiserver holds it now (None: there is none)."""
        try:
            return self.rest.get(SECRETS, secret_name(database), database.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None

    def _uncached(self, database: Database, tenant: str) -> tuple[Secret, SecretState]:
        """The Secret of that name that the label-selected cache does not hold (or not yet).

        One written before its labels were the cache's selector (or stripped of them) is ours
        again once labelled; anyone else's stays untouched and is reported as a conflict.
        """
        secret = self.rest.get(SECRETS, secret_name(database), database.namespace)
        state = classify_secret(secret, database.uid, tenant)
        labels = credentials_labels(database.db)
        have = ObjectMeta.of(secret).labels
        if state is SecretState.OURS and any(have.get(k) != v for k, v in labels.items()):
            ensure_active()
            patch = conditional({"metadata": {"labels": labels}}, secret)
            secret = self.rest.patch(SECRETS, secret_name(database), patch, database.namespace)
        return secret, state

    def reread(self, database: Database, secret: Secret) -> Secret:
        """The Secret from the apiserver, with its data (before SQL that must run once: the cache may lag our
        writes, and holds no data)."""
        return self.rest.get(SECRETS, secret_name(database), database.namespace)

    def delete(self, database: Database) -> None:
        """Remove the Secret (no garbage collector is relied on); gone already is fine."""
        ensure_active()
        try:
            self.rest.delete(SECRETS, secret_name(database), database.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
