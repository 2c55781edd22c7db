"""The Kubernetes resources the API reads and writes, and small helpers over the objects (plain dicts)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from domain.constants import GROUP, PLURAL_CONSUMERS, PLURAL_DATABASES, VERSION
from informers import SECRETS, Resource

CONSUMERS = Resource(GROUP, VERSION, PLURAL_CONSUMERS)
DATABASES = Resource(GROUP, VERSION, PLURAL_DATABASES)

__all__ = ["CONSUMERS", "DATABASES", "SECRETS", "annotations", "metadata", "secret_bytes", "spec", "status"]

Obj = dict[str, Any]


def metadata(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def spec(obj: Obj) -> dict[str, Any]:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


def status(obj: Obj) -> dict[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, dict) else {}


def annotations(obj: Obj) -> dict[str, str]:
    value = metadata(obj).get("annotations")
    return value if isinstance(value, dict) else {}


def secret_bytes(secret: Obj, key: str) -> bytes | None:
    """The decoded value of `key` in a Secret's data, or None if the key is missing or not base64."""
    data = secret.get("data")
    if not isinstance(data, dict):
        return None
    raw = data.get(key)
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None
