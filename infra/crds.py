"""CRD schemas generated from the domain models (domain.specs, domain.status).

The typed models are the source of every schema, so the apiserver enforces what the Python code reads:
pydantic's JSON schema is turned into a Kubernetes *structural* schema (every `$ref` inlined, `anyOf`
with null collapsed to an optional field, no titles, a type on every node) and every property must carry
a description so `kubectl explain` explains it. Defaults stay in the spec schemas (the apiserver applies
them) and are dropped from the status schemas (status is written by the provider only).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from domain.constants import (
    CLAIM_NAMES,
    GROUP,
    KINDS,
    SERVED_VERSIONS,
    SINGULAR_CONSUMER,
    SINGULAR_DATABASE,
    SINGULAR_DATABASE_MOVE,
    SINGULAR_SHARD,
    VERSION,
)
from domain.specs import ConsumerSpec, DatabaseClaimSpec, DatabaseMoveSpec, DatabaseSpec, ShardSpec
from domain.status import ConsumerStatus, DatabaseClaimStatus, DatabaseMoveStatus, DatabaseStatus, ShardStatus

# Keys the apiserver accepts in a structural schema node; anything else pydantic emits is dropped.
_ALLOWED_KEYS = {
    "type",
    "format",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    "uniqueItems",
    "nullable",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource",
}


class SchemaError(ValueError):
    """A domain model cannot be expressed as a structural CRD schema (a bug in the model)."""


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline `$ref`s: the referenced schema, overlaid with the referring node's own keys."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name not in defs:
            raise SchemaError(f"unresolvable $ref {node['$ref']}")
        target = copy.deepcopy(defs[name])
        overlay = {k: v for k, v in node.items() if k != "$ref"}
        node = {**target, **overlay}
    return {key: _resolve(value, defs) for key, value in node.items()}


def _collapse_nullable(node: dict[str, Any], path: str) -> dict[str, Any]:
    """`anyOf: [X, {type: null}]` (an Optional field) becomes X: absent means None."""
    if "anyOf" not in node:
        return node
    branches = [b for b in node["anyOf"] if b != {"type": "null"}]
    if len(branches) != 1:
        raise SchemaError(f"{path}: unions other than Optional[X] cannot be structural")
    merged = {**branches[0], **{k: v for k, v in node.items() if k != "anyOf"}}
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _structural(node: dict[str, Any], path: str, *, keep_defaults: bool) -> dict[str, Any]:
    node = _collapse_nullable(node, path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _ALLOWED_KEYS:
            continue  # title, $defs, examples...
        if key == "default" and not keep_defaults:
            continue
        if key == "properties":
            value = {
                name: _structural(child, f"{path}.{name}", keep_defaults=keep_defaults) for name, child in value.items()
            }
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            value = _structural(value, f"{path}[]", keep_defaults=keep_defaults)
        out[key] = value
    if "type" not in out:
        if "enum" in out and all(isinstance(v, str) for v in out["enum"]):
            out["type"] = "string"
        else:
            raise SchemaError(f"{path}: no type (structural schemas need one on every node)")
    if not out.get("description"):
        raise SchemaError(f"{path}: no description (add one to the domain model so `kubectl explain` shows it)")
    if out["type"] == "object" and "properties" in out and not out.get("required"):
        out.pop("required", None)
    first = [k for k in ("type", "description") if k in out]
    return {**{k: out[k] for k in first}, **{k: v for k, v in out.items() if k not in first}}


def structural_schema(model: type[BaseModel], *, keep_defaults: bool = True, description: str = "") -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model` (camelCase keys, as the apiserver stores the object)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    if description:
        resolved["description"] = description
    return _structural(resolved, model.__name__, keep_defaults=keep_defaults)


# Per kind key (domain.constants.KINDS): (spec model, status model, description of the whole object).
_MODELS: dict[str, tuple[type[BaseModel], type[BaseModel], str]] = {
    SINGULAR_SHARD: (
        ShardSpec,
        ShardStatus,
        "A Shard is one database cluster (a Percona PostgreSQL cluster, or a Keldon Cloudberry cluster) the "
        "provider may place tenant databases into. Cluster-scoped; declared in the landscape repository.",
    ),
    SINGULAR_CONSUMER: (
        ConsumerSpec,
        ConsumerStatus,
        "A Consumer is one calling cluster: it authenticates with a bearer token whose SHA-256 is stored in a "
        "Secret, and sees and acts on its own databases only. Cluster-scoped.",
    ),
    SINGULAR_DATABASE: (
        DatabaseSpec,
        DatabaseStatus,
        "A Database is one tenant database (a role and a database on a shard) requested by a consumer "
        "through the API. Lives in the release namespace; its credentials are in <name>-credentials.",
    ),
    SINGULAR_DATABASE_MOVE: (
        DatabaseMoveSpec,
        DatabaseMoveStatus,
        "A DatabaseMove asks for one Database to be moved to another shard (same role name and password, only "
        "the host changes). Lives in the namespace of its Database.",
    ),
}
assert set(_MODELS) == set(KINDS)


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


# The consumer cluster's kind (the agent's CRD, `dbprovider render --agent`): not one of the provider's.
CLAIM_KEY = "databaseclaim"
CLAIM_VERSIONS = (VERSION,)  # its own version story: v1alpha1 only, so far
_CLAIM_MODEL = (
    DatabaseClaimSpec,
    DatabaseClaimStatus,
    "A DatabaseClaim asks the provider for a database from a consumer cluster; the dbprovider agent creates "
    "it, keeps its connection details in a Secret (servicebinding.io) and deletes it with the claim.",
)


def object_schema(key: str) -> dict[str, Any]:
    """The full openAPIV3Schema of one kind (a key of domain.constants.KINDS, or CLAIM_KEY)."""
    spec_model, status_model, description = _CLAIM_MODEL if key == CLAIM_KEY else _MODELS[key]
    kind = CLAIM_NAMES.kind if key == CLAIM_KEY else KINDS[key].kind
    versions = CLAIM_VERSIONS if key == CLAIM_KEY else SERVED_VERSIONS
    spec = structural_schema(spec_model, description=_first_line(spec_model))
    status = structural_schema(
        status_model, keep_defaults=False, description=f"{_first_line(status_model)} Written by the provider."
    )
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"APIVersion of this object: {' or '.join(f'{GROUP}/{v}' for v in versions)} "
                "(one schema).",
            },
            "kind": {"type": "string", "description": f"Kind of this object: {kind}."},
            "metadata": {"type": "object"},  # the apiserver allows nothing else here
            "spec": spec,
            "status": status,
        },
    }


def crd_schemas() -> dict[str, dict[str, Any]]:
    """openAPIV3Schema per kind key, as the CRD template consumes them."""
    return {key: object_schema(key) for key in _MODELS}


def claim_schema() -> dict[str, Any]:
    """openAPIV3Schema of the DatabaseClaim CRD (consumer clusters)."""
    return object_schema(CLAIM_KEY)
