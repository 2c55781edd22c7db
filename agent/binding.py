"""The Secret the agent writes for a claim: a servicebinding.io provisioned service's Secret.

Type `servicebinding.io/postgresql`, keys `type`, `provider`, `host`, `port`, `database`, `username`,
`password`, `uri`, `sslmode` (and, when the provider hands out the CA of the shard's client endpoint,
`ca.crt` with it and `sslrootcert` naming that file, as Spring Cloud Bindings reads it), the label
naming the claim (what the agent's one Secret watch selects) and the provider's credentialsVersion of
the values (workloads and the agent tell from it that the credentials changed). Owned by the claim,
so it goes with the claim; under deletionPolicy Orphan the agent drops the owner reference before
the claim goes. Pure functions; the agent does the API calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.constants import (
    ANNOTATION_CREDENTIALS_VERSION,
    API_VERSION,
    BINDING_PROVIDER,
    BINDING_SECRET_TYPE,
    BINDING_TYPE,
    CLAIM_NAMES,
    CORE_API_VERSION,
    KIND_SECRET,
    LABEL_CLAIM,
    LABEL_MANAGED_BY,
)
from domain.credentials import encode_secret_value
from domain.naming import claim_database_id, label_value
from domain.objects import ClaimObject, Obj

MANAGED_BY_AGENT = "dbprovider-agent"
# The agent's Secret watch: only the Secrets it wrote (a label selector, one watch for all claims).
OWNED_SECRETS_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY_AGENT},{LABEL_CLAIM}"
BINDING_KEYS = ("type", "provider", "host", "port", "database", "username", "password", "uri", "sslmode")
CA_FILE_KEY = "ca.crt"
# The Service Binding key naming the CA file within the binding (a file name, not the PEM).
SSLROOTCERT_KEY = "sslrootcert"


def database_id(claim: ClaimObject) -> str:
    """The claim's externalId at the provider: spec.databaseId, else derived from namespace and name."""
    if claim.spec.database_id:
        return claim.spec.database_id
    return claim_database_id(claim.metadata.namespace or "", claim.name)


def secret_name(claim: ClaimObject) -> str:
    """The Secret's name: spec.secretName, else the claim's name."""
    return claim.spec.secret_name or claim.name


def _owner(claim: ClaimObject) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": CLAIM_NAMES.kind,
        "name": claim.name,
        "uid": claim.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def binding_data(credentials: Mapping[str, Any]) -> dict[str, str]:
    """The Secret's keys from the provider's credentials answer (the CA keys only when it carries `caCert`)."""
    values = {
        "type": BINDING_TYPE,
        "provider": BINDING_PROVIDER,
        "host": str(credentials["host"]),
        "port": str(credentials["port"]),
        "database": str(credentials["database"]),
        "username": str(credentials["user"]),
        "password": str(credentials["password"]),
        "uri": str(credentials["uri"]),
        "sslmode": str(credentials["sslmode"]),
    }
    ca_pem = credentials.get("caCert")
    if isinstance(ca_pem, str) and ca_pem:
        values[CA_FILE_KEY] = ca_pem
        values[SSLROOTCERT_KEY] = CA_FILE_KEY
    return values


def binding_secret(claim: ClaimObject, values: Mapping[str, str], version: str) -> Obj:
    """The whole Secret for `claim` with `values` (binding_data), owned by the claim."""
    return {
        "apiVersion": CORE_API_VERSION,
        "kind": KIND_SECRET,
        "type": BINDING_SECRET_TYPE,
        "metadata": {
            "name": secret_name(claim),
            "namespace": claim.metadata.namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY_AGENT, LABEL_CLAIM: label_value(claim.name)},
            "annotations": {ANNOTATION_CREDENTIALS_VERSION: version},
            "ownerReferences": [_owner(claim)],
        },
        "data": {key: encode_secret_value(value) for key, value in values.items()},
    }


def is_claims_secret(secret: Mapping[str, Any], claim: ClaimObject) -> bool:
    """The Secret is this claim's: our label names it, and no other object controls it.

    A Secret left by an Orphan claim of the same name (no owner any more) is taken over; any other
    Secret under that name is foreign and never overwritten.
    """
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY_AGENT or labels.get(LABEL_CLAIM) != label_value(claim.name):
        return False
    controllers = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
    return all(ref.get("uid") == claim.metadata.uid for ref in controllers)


def secret_version(secret: Mapping[str, Any] | None) -> str | None:
    """The credentialsVersion the Secret holds the values of."""
    if secret is None:
        return None
    return ((secret.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CREDENTIALS_VERSION)


def differs(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Writing `desired` over `existing` would change something (type, data, our labels, annotation, owner)."""
    if existing.get("type") != desired.get("type") or (existing.get("data") or {}) != desired["data"]:
        return True
    have, want = existing.get("metadata") or {}, desired["metadata"]
    for field in ("labels", "annotations"):
        current = have.get(field) or {}
        if any(current.get(key) != value for key, value in want[field].items()):
            return True
    return _controller_uid(have) != _controller_uid(want)


def merged(existing: Mapping[str, Any], desired: Obj) -> Obj:
    """`desired` as a full replace of `existing`: its resourceVersion, and labels and annotations others set kept."""
    meta = existing.get("metadata") or {}
    body = {**desired, "metadata": dict(desired["metadata"])}
    body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
    for field in ("labels", "annotations"):
        body["metadata"][field] = {**(meta.get(field) or {}), **desired["metadata"][field]}
    return body


def without_owner(secret: Mapping[str, Any], claim: ClaimObject) -> list[dict[str, Any]] | None:
    """The Secret's ownerReferences without the claim's (None: the claim is not among them)."""
    refs = list((secret.get("metadata") or {}).get("ownerReferences") or [])
    kept = [ref for ref in refs if ref.get("uid") != claim.metadata.uid]
    return kept if len(kept) != len(refs) else None


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    return next((ref.get("uid") for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
