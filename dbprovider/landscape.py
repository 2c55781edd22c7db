"""The landscape repository's files as `consumer` and `lint` read and write them.

A landscape repository holds Shard, Consumer and Secret objects as YAML (one or more documents per
file) and the install values. The hash Secret of a consumer may carry its lines under `stringData`
(what `consumer new` writes: readable in a merge request) or base64 under `data`; both are read the
way the apiserver combines them (stringData wins) and rewritten in the form they were found in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.constants import API_VERSION, CORE_API_VERSION, DEFAULT_TOKEN_KEY, KIND_CONSUMER, KIND_SECRET
from domain.credentials import decode_secret_value, encode_secret_value
from domain.metadata import Identity

# File names `consumer new` writes into --out; the suffixes keep any two consumers' files apart.
CONSUMER_FILE_SUFFIX = ".consumer.yaml"
TOKEN_SECRET_FILE_SUFFIX = ".token-secret.yaml"


def is_secret(doc: Any) -> bool:
    identity = Identity.of(doc)
    return isinstance(doc, dict) and (identity.api_version, identity.kind) == (CORE_API_VERSION, KIND_SECRET)


def token_secret_name(consumer: str) -> str:
    return f"{consumer}-token"


def consumer_object(
    name: str, namespace: str, max_databases: int | None, key: str = DEFAULT_TOKEN_KEY
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tokenSecretRef": {"namespace": namespace, "name": token_secret_name(name), "key": key},
    }
    if max_databases is not None:
        spec["maxDatabases"] = max_databases
    return {"apiVersion": API_VERSION, "kind": KIND_CONSUMER, "metadata": {"name": name}, "spec": spec}


def hash_secret_object(
    name: str, namespace: str, hash_lines: list[str], key: str = DEFAULT_TOKEN_KEY
) -> dict[str, Any]:
    return {
        "apiVersion": CORE_API_VERSION,
        "kind": KIND_SECRET,
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "stringData": {key: join_lines(hash_lines)},
    }


def join_lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


class SecretValueError(ValueError):
    """A Secret key whose value cannot be read (not base64, not a string); the value is never echoed."""


@dataclass(frozen=True)
class SecretValue:
    """One key of a Secret as the apiserver would store it, and where it was found."""

    text: str | bytes
    section: str  # "stringData" or "data"


def read_secret_value(secret: dict[str, Any], key: str) -> SecretValue | None:
    """The value of `key` (stringData over data, as the apiserver merges them), or None if absent."""
    string_data = secret.get("stringData") or {}
    if isinstance(string_data, dict) and key in string_data:
        value = string_data[key]
        if not isinstance(value, str):
            raise SecretValueError(f"stringData.{key} must be a string")
        return SecretValue(value, "stringData")
    data = secret.get("data") or {}
    if isinstance(data, dict) and key in data:
        value = data[key]
        return SecretValue(decode_data_value(value, key), "data")
    return None


def decode_data_value(value: Any, key: str) -> bytes:
    """A value under `data`: base64, as the apiserver requires."""
    if not isinstance(value, str):
        raise SecretValueError(f"data.{key} must be a base64 string")
    decoded = decode_secret_value(value)
    if decoded is None:
        raise SecretValueError(f"data.{key} is not valid base64")
    return decoded


def write_secret_value(secret: dict[str, Any], key: str, text: str, section: str) -> None:
    """Set `key` in the section it was found in (base64 for data)."""
    if section == "data":
        secret.setdefault("data", {})[key] = encode_secret_value(text)
    else:
        secret.setdefault("stringData", {})[key] = text
