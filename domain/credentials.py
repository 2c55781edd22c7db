"""The credentials Secret `<database-name>-credentials`: its format, and whether it is ours and usable.

The Database controller writes the Secret and the API hands its values out; both read it through
this module, so the format (keys, base64, owner, password id) is defined once. The Secret is the
source of truth for the tenant's password: it is written before any SQL creates the role, so a crash
between the two never loses a password. Pure functions; the callers do the API calls.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from domain.constants import (
    ANNOTATION_PASSWORD_ID,
    CORE_API_VERSION,
    CREDENTIALS_KEYS,
    KIND_SECRET,
    LABEL_CONSUMER,
    LABEL_EXTERNAL_ID,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from domain.hosts import is_valid_client_host
from domain.naming import credentials_secret_name, label_value, login_roles
from domain.specs import SSLMODES, ShardSpec

ENDPOINT_KEYS = ("host", "port", "sslmode")
# The optional key holding the client endpoint's CA certificates (PEM): present only when the Shard names them.
CA_CERT_KEY = "caCert"

# -- Secret data (base64) --------------------------------------------------------------------------


def decode_secret_value(raw: object) -> bytes | None:
    """One value of a Secret's `data`: strict base64 as the apiserver writes it; None if not that."""
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None


def encode_secret_value(text: str) -> str:
    """A text as a value of a Secret's `data` (UTF-8, base64)."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def opaque_secret(name: str, namespace: str, data: Mapping[str, str], type_: str = "Opaque") -> dict[str, Any]:
    """A Secret object holding `data`'s texts (base64 in `data`, as the apiserver stores them)."""
    return {
        "apiVersion": CORE_API_VERSION,
        "kind": KIND_SECRET,
        "type": type_,
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: encode_secret_value(v) for k, v in data.items()},
    }


def secret_data_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    """The decoded value of `key` in a Secret's data, or None if the key is missing or not base64."""
    _require_data(secret)
    data = secret.get("data")
    return decode_secret_value(data.get(key)) if isinstance(data, Mapping) else None


def secret_data_values(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """Every key of a Secret's data, decoded; a value that is not base64 is left out."""
    _require_data(secret)
    data = secret.get("data")
    if not isinstance(data, Mapping):
        return {}
    return {key: value for key, raw in data.items() if (value := decode_secret_value(raw)) is not None}


def decode_secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    """Every key of a Secret's data as text; a value that is not base64 UTF-8 reads as "" (unusable).
    A Secret as the caches hold it has no data to read: ValueError (read it from the apiserver)."""
    _require_data(secret)
    data = secret.get("data")
    if not isinstance(data, Mapping):
        return {}
    values: dict[str, str] = {}
    for key, raw in data.items():
        decoded = decode_secret_value(raw)
        try:
            values[key] = decoded.decode("utf-8") if decoded is not None else ""
        except UnicodeDecodeError:
            values[key] = ""
    return values


secret_values = decode_secret_data  # the name the controllers know it by


# -- a Secret as the caches hold it ----------------------------------------------------------------

# The keys of a cached Secret (domain.cached) that stand for its data (`secret_digest` of it), for the password
# id of its annotations and for its controller reference (the owner's uid): one flat mapping instead of the
# annotations, the owner references and the reference's own mapping, for each of a fleet's Secrets.
DIGEST = "digest"
CACHED_PASSWORD_ID = "passwordId"
CACHED_CONTROLLER_UID = "controllerUid"
_DIGESTED = ("database", "user", "host", "port", "sslmode")


def is_digested(secret: Mapping[str, Any]) -> bool:
    """The Secret is the caches' form: metadata and a digest, no data."""
    return DIGEST in secret


def cached_secret_summary(secret: Mapping[str, Any]) -> dict[str, str]:
    """What a cache keeps of a whole credentials Secret besides its name and version: its digest, password id
    and controller's uid (the last two when it has them, as `sys.intern` holds them: the same strings as the
    cached Database's uid and status.passwordApplied, domain.cached)."""
    summary = {DIGEST: secret_digest(secret)}
    for key, value in ((CACHED_PASSWORD_ID, password_id(secret)), (CACHED_CONTROLLER_UID, controller_uid(secret))):
        if value is not None:
            summary[key] = sys.intern(value)
    return summary


def _require_data(secret: Mapping[str, Any]) -> None:
    if DIGEST in secret:
        raise ValueError("a Secret from the cache holds no data: read it from the apiserver")


def _password_usable(raw: object) -> bool:
    password = decode_secret_value(raw)
    if not password:
        return False
    try:
        return bool(password.decode("utf-8"))  # as decode_secret_data reads it
    except UnicodeDecodeError:
        return False


def _digest_of(values: tuple[object, ...], password_usable: bool) -> str:
    text = "\0".join(value if isinstance(value, str) else "\1" for value in values)
    return hashlib.blake2b(f"{text}\0{int(password_usable)}".encode(), digest_size=8).hexdigest()


def secret_digest(secret: Mapping[str, Any]) -> str:
    """What decides that a credentials Secret is current, in 16 hex digits: its database, user, host, port,
    sslmode and CA (if it has one) as stored (base64), and whether its password is usable (never the
    password itself). The caches keep this instead of the data; `secret_settled` compares it with `expected_digest`."""
    if DIGEST in secret:
        return str(secret[DIGEST])
    data = secret.get("data")
    data = data if isinstance(data, Mapping) else {}
    values = tuple(data.get(key) for key in _DIGESTED)
    if CA_CERT_KEY in data:  # only then: the digest of a Secret without a CA is what it always was
        values = (*values, data.get(CA_CERT_KEY))
    return _digest_of(values, _password_usable(data.get("password")))


def expected_digest(tenant: str, endpoint: Endpoint, login: str | None = None) -> str:
    """The digest of a Secret that names database `tenant`, user `login` (default: the tenant role) and
    `endpoint`, and holds a usable password."""
    database = encode_secret_value(tenant)
    user = database if login is None else encode_secret_value(login)
    return _digest_of((database, user, *_encoded_endpoint(endpoint)), True)


# -- passwords -------------------------------------------------------------------------------------


def new_password() -> str:
    """A random password for a tenant role (256 bits, URL-safe, no quoting trouble in URIs)."""
    return secrets.token_urlsafe(32)


def new_password_id() -> str:
    """The id that goes with a new password (random, so it tells nothing about the password)."""
    return secrets.token_hex(8)


def password_id(secret: Mapping[str, Any]) -> str | None:
    """The Secret's password id; None for a Secret written without one (nothing pending then)."""
    if DIGEST in secret:
        cached: str | None = secret.get(CACHED_PASSWORD_ID)
        return cached
    return ((secret.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PASSWORD_ID)


def password_pending(secret: Mapping[str, Any], password_applied: str | None) -> bool:
    """The Secret holds a password that may not be on the role yet (status.passwordApplied names another id)."""
    current = password_id(secret)
    return current is not None and current != password_applied


def password_patch(password: str, user: str | None = None) -> dict[str, Any]:
    """A merge patch putting a new password, with a new id, into the Secret (a rotation); with `user`,
    the login role it belongs to as well (a rotation with an overlap hands out the other role)."""
    data = {"password": encode_secret_value(password)}
    if user is not None:
        data["user"] = encode_secret_value(user)
    return {"metadata": {"annotations": {ANNOTATION_PASSWORD_ID: new_password_id()}}, "data": data}


def credentials_version(secret: Mapping[str, Any], password_applied: str | None) -> str:
    """A short digest that changes whenever the credentials a consumer is handed change, and only then.

    It covers the Secret's identity, the id of the password in effect (the applied one while a new one
    is pending) and the other keys, never the password itself: a consumer compares it with the one it
    last fetched instead of fetching the credentials again. A Secret written without a password id
    falls back to its resourceVersion. Derived from shared state, so every API replica gives the same.
    """
    meta = secret.get("metadata") or {}
    served_id = password_applied or password_id(secret) or f"rv:{meta.get('resourceVersion', '')}"
    # The other keys through `secret_digest`: the same from a whole Secret and from the caches' form.
    parts = [str(meta.get("uid", "")), served_id, secret_digest(secret)]
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:16]


# -- ownership and consistency ---------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where consumers connect: the Shard's client block (with the CA that signs its certificate, if named)."""

    host: str
    port: int
    sslmode: str
    ca_cert: str | None = None

    @classmethod
    def of_shard(cls, spec: ShardSpec) -> Endpoint:
        """The client endpoint a Shard hands to consumers (its spec's defaults included)."""
        return cls(spec.client.host, spec.client.port, str(spec.client.sslmode), spec.client.ca_cert)

    def values(self) -> dict[str, str]:
        """The endpoint's keys as a credentials Secret holds them (caCert only when there is a CA)."""
        values = {"host": self.host, "port": str(self.port), "sslmode": self.sslmode}
        if self.ca_cert is not None:
            values[CA_CERT_KEY] = self.ca_cert
        return values


class SecretState(StrEnum):
    MISSING = "missing"
    OURS = "ours"
    FOREIGN = "foreign"  # exists, not controlled by this Database: never overwritten
    INCONSISTENT = "inconsistent"  # ours, but names or password do not match the tenant


def is_controlled_by(secret: Mapping[str, Any], database_uid: str | None) -> bool:
    """The Secret's controller ownerReference is the Database with this uid (anything else is not ours)."""
    return bool(database_uid) and controller_uid(secret) == database_uid


def controller_uid(secret: Mapping[str, Any]) -> str | None:
    """The uid of the Secret's controller (its ownerReference with `controller: true`; Kubernetes allows one)."""
    if DIGEST in secret:
        cached: str | None = secret.get(CACHED_CONTROLLER_UID)
        return cached
    for ref in (secret.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def names_tenant(values: Mapping[str, str], tenant: str) -> bool:
    """The decoded Secret names `tenant` as its database, and one of the tenant's login roles as its user."""
    return values.get("database") == tenant and values.get("user") in login_roles(tenant)


def classify_secret(secret: Mapping[str, Any] | None, database_uid: str, tenant: str) -> SecretState:
    """Is the existing Secret ours and consistent with the tenant name stored in status?"""
    if secret is None:
        return SecretState.MISSING
    if not is_controlled_by(secret, database_uid):
        return SecretState.FOREIGN
    values = decode_secret_data(secret)
    if not names_tenant(values, tenant) or not values.get("password"):
        return SecretState.INCONSISTENT
    return SecretState.OURS


def secret_settled(
    secret: Mapping[str, Any], database_uid: str, tenant: str, endpoint: Endpoint, login: str | None = None
) -> bool:
    """The Secret is ours and consistent (`classify_secret` says OURS) and its endpoint keys are `endpoint`'s
    (`endpoint_patch` finds nothing to change), checked for every Secret at a start on the caches' form: its
    digest (`secret_digest`) is that of the expected values in their base64 form (the apiserver always writes
    the canonical one; any other reads as not settled, and the full pass decides)."""
    return is_controlled_by(secret, database_uid) and secret_digest(secret) == expected_digest(tenant, endpoint, login)


@lru_cache(maxsize=1024)
def _encoded_endpoint(endpoint: Endpoint) -> tuple[str, ...]:
    """host, port, sslmode (and the CA, if any) as a Secret's data holds them (one entry per client block)."""
    encoded = (
        encode_secret_value(endpoint.host),
        encode_secret_value(str(endpoint.port)),
        encode_secret_value(endpoint.sslmode),
    )
    return encoded if endpoint.ca_cert is None else (*encoded, encode_secret_value(endpoint.ca_cert))


def missing_key(values: Mapping[str, str]) -> str | None:
    """The first of the six credentials keys that is absent, empty or undecodable; None if all are there."""
    return next((key for key in CREDENTIALS_KEYS if not values.get(key)), None)


def endpoint_problem(values: Mapping[str, str]) -> str | None:
    """What is wrong with the decoded host, port and sslmode for a consumer to connect; None if nothing."""
    if not is_valid_client_host(values.get("host")):
        return "the host in the credentials Secret is not a valid client host"
    port = values.get("port") or ""
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "the port in the credentials Secret is invalid"
    if values.get("sslmode") not in SSLMODES:
        return "the sslmode in the credentials Secret is invalid"
    return None


# -- writing ---------------------------------------------------------------------------------------


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
    values |= endpoint.values()
    return {
        "apiVersion": CORE_API_VERSION,
        "kind": KIND_SECRET,
        "type": "Opaque",
        "metadata": {
            "name": credentials_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "annotations": {ANNOTATION_PASSWORD_ID: new_password_id()},
            "labels": credentials_labels(database),
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
        "data": {key: encode_secret_value(value) for key, value in values.items()},
    }


def endpoint_patch(secret: Mapping[str, Any], endpoint: Endpoint) -> dict[str, Any] | None:
    """A merge patch rewriting only host/port/sslmode and the CA (removed when the Shard names none any more),
    or None when they already match."""
    current = decode_secret_data(secret)
    wanted = endpoint.values()
    changed: dict[str, str | None] = {k: encode_secret_value(v) for k, v in wanted.items() if current.get(k) != v}
    if CA_CERT_KEY in current and CA_CERT_KEY not in wanted:
        changed[CA_CERT_KEY] = None  # a merge patch's null removes the key
    return {"data": changed} if changed else None
