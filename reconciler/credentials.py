"""The credentials Secret `<database-name>-credentials`: what it holds and whether it is ours.

The Secret is the source of truth for the tenant's password: it is written before any SQL creates
the role, so a crash between the two never loses a password. These are pure functions; the Database
controller does the API calls.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from domain.constants import (
    ANNOTATION_PASSWORD_ID,
    CREDENTIALS_KEYS,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from domain.naming import credentials_secret_name, label_value

ENDPOINT_KEYS = ("host", "port", "sslmode")


def new_password() -> str:
    """A random password for a tenant role (256 bits, URL-safe, no quoting trouble in URIs)."""
    return secrets.token_urlsafe(32)


def new_password_id() -> str:
    """The id that goes with a new password (random, so it tells nothing about the password)."""
    return secrets.token_hex(8)


def password_id(secret: Mapping[str, Any]) -> str | None:
    """The Secret's password id; None for a Secret written without one (nothing pending then)."""
    return ((secret.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PASSWORD_ID)


def password_patch(password: str) -> dict[str, Any]:
    """A merge patch putting a new password, with a new id, into the Secret (a rotation)."""
    return {
        "metadata": {"annotations": {ANNOTATION_PASSWORD_ID: new_password_id()}},
        "data": {"password": base64.b64encode(password.encode()).decode()},
    }


@dataclass(frozen=True)
class Endpoint:
    """Where consumers connect: the Shard's client block."""

    host: str
    port: int
    sslmode: str


class SecretState(StrEnum):
    MISSING = "missing"
    OURS = "ours"
    FOREIGN = "foreign"  # exists, not controlled by this Database: never overwritten
    INCONSISTENT = "inconsistent"  # ours, but names or password do not match the tenant


def _decode(secret: Mapping[str, Any]) -> dict[str, str]:
    data = secret.get("data") or {}
    out = {}
    for key, value in data.items():
        try:
            out[key] = base64.b64decode(value).decode()
        except (ValueError, UnicodeDecodeError):
            out[key] = ""
    return out


def secret_values(secret: Mapping[str, Any]) -> dict[str, str]:
    """The decoded keys of a Secret object as the API returns it."""
    return _decode(secret)


def classify_secret(secret: Mapping[str, Any] | None, database_uid: str, tenant: str) -> SecretState:
    """Is the existing Secret ours and consistent with the tenant name stored in status?"""
    if secret is None:
        return SecretState.MISSING
    owners = (secret.get("metadata") or {}).get("ownerReferences") or []
    if not any(ref.get("uid") == database_uid and ref.get("controller") for ref in owners):
        return SecretState.FOREIGN
    values = _decode(secret)
    if values.get("database") != tenant or values.get("user") != tenant or not values.get("password"):
        return SecretState.INCONSISTENT
    return SecretState.OURS


def credentials_labels(database: Mapping[str, Any]) -> dict[str, str]:
    """The labels that put a credentials Secret into the provider's (label-selected) Secrets cache."""
    spec = database["spec"]
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_CONSUMER: label_value(spec["consumer"]),
        LABEL_EXTERNAL_ID: label_value(spec["externalId"]),
    }


def build_secret(database: Mapping[str, Any], tenant: str, password: str, endpoint: Endpoint) -> dict[str, Any]:
    """The full Secret for a Database, owned by it (controller reference, so it is listed as ours),
    with a new password id: the password is pending until the id is in the Database's status."""
    meta = database["metadata"]
    values = {
        "host": endpoint.host,
        "port": str(endpoint.port),
        "database": tenant,
        "user": tenant,
        "password": password,
        "sslmode": endpoint.sslmode,
    }
    assert tuple(values) == CREDENTIALS_KEYS
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": credentials_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "annotations": {ANNOTATION_PASSWORD_ID: new_password_id()},
            "labels": {
                **credentials_labels(database),
            },
            "ownerReferences": [
                {
                    "apiVersion": database["apiVersion"],
                    "kind": database["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in values.items()},
    }


def endpoint_patch(secret: Mapping[str, Any], endpoint: Endpoint) -> dict[str, Any] | None:
    """A merge patch rewriting only host/port/sslmode, or None when they already match."""
    current = _decode(secret)
    wanted = {"host": endpoint.host, "port": str(endpoint.port), "sslmode": endpoint.sslmode}
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not changed:
        return None
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in changed.items()}}
