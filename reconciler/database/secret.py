"""The Database's credentials Secret: created before the role (the source of its password),
endpoint keys kept equal to the Shard's client block, never overwritten when it is not ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.constants import DatabaseReason, Phase
from domain.credentials import (
    Endpoint,
    SecretState,
    build_secret,
    classify_secret,
    credentials_labels,
    endpoint_patch,
    new_password,
    password_id,
    secret_values,
)
from domain.naming import credentials_secret_name
from informers import SECRETS, Informer, Rest
from reconciler.database.report import Reporter
from reconciler.database.state import Pass
from reconciler.database.writes import conditional
from reconciler.runtime import ensure_active

Secret = dict[str, Any]


def secret_name(p: Pass) -> str:
    return credentials_secret_name(p.name)


def password(secret: Secret) -> str:
    return secret_values(secret)["password"]


def password_pending(p: Pass, secret: Secret) -> bool:
    """The Secret holds a password that may not be set on the role yet."""
    current = password_id(secret)
    return current is not None and current != p.status.password_applied


def password_applied(p: Pass, secret: Secret) -> None:
    """Record (with the next status write) that the Secret's password is the role's."""
    current = password_id(secret)
    if current is not None:
        p.update(password_applied=current)


@dataclass
class CredentialsSecrets:
    """Reads (from the label-selected cache, or live), creates, labels and deletes credentials Secrets."""

    rest: Rest
    secrets: Informer
    report: Reporter

    def ensure(self, p: Pass, endpoint: Endpoint) -> Secret:
        """The credentials Secret: created before the role exists; endpoint keys follow the shard."""
        tenant = p.tenant
        secret = self.secrets.get(f"{p.namespace}/{secret_name(p)}")
        state = classify_secret(secret, p.uid, tenant)
        if state is SecretState.MISSING:
            # Its new password (a new id) is pending until status.passwordApplied names it: the role
            # may exist already (the Secret was deleted, an existing tenant is adopted, or a crash hit
            # between the SQL and the status write), and ensure_tenant leaves a finished tenant's
            # password alone.
            body = build_secret(p.db, tenant, new_password(), endpoint)
            ensure_active()
            try:
                return self.rest.create(SECRETS, body, p.namespace)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            secret, state = self._uncached(p, tenant)
        if state is not SecretState.OURS:
            what = "is not owned by this Database" if state is SecretState.FOREIGN else "is inconsistent"
            self.report.fail(
                p,
                p.status.phase or Phase.PROVISIONING,
                DatabaseReason.CREDENTIALS_SECRET_CONFLICT,
                f"Secret {secret_name(p)} {what}; it is never overwritten",
            )
        assert secret is not None
        patch = endpoint_patch(secret, endpoint)
        if patch is not None:
            ensure_active()
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], conditional(patch, secret), p.namespace)
        return secret

    def _uncached(self, p: Pass, tenant: str) -> tuple[Secret, SecretState]:
        """The Secret of that name that the label-selected cache does not hold (or not yet).

        One written before its labels were the cache's selector (or stripped of them) is ours
        again once labelled; anyone else's stays untouched and is reported as a conflict.
        """
        secret = self.rest.get(SECRETS, secret_name(p), p.namespace)
        state = classify_secret(secret, p.uid, tenant)
        labels = credentials_labels(p.db)
        if state is SecretState.OURS and any(
            (secret["metadata"].get("labels") or {}).get(k) != v for k, v in labels.items()
        ):
            ensure_active()
            patch = {"metadata": {"labels": labels, "resourceVersion": secret["metadata"]["resourceVersion"]}}
            secret = self.rest.patch(SECRETS, secret["metadata"]["name"], patch, p.namespace)
        return secret, state

    def reread(self, p: Pass, secret: Secret) -> Secret:
        """The Secret from the apiserver (before SQL that must run once: the cache may lag our writes)."""
        return self.rest.get(SECRETS, secret["metadata"]["name"], p.namespace)

    def delete(self, p: Pass) -> None:
        """Remove the Secret (no garbage collector is relied on); gone already is fine."""
        ensure_active()
        try:
            self.rest.delete(SECRETS, secret_name(p), p.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
