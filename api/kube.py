"""The Kubernetes resources the API reads and writes, and small helpers over the objects (plain dicts)."""

from __future__ import annotations

from typing import Any

from domain.objects import Obj
from domain.resources import CONSUMERS, DATABASES
from informers import SECRETS

__all__ = ["CONSUMERS", "DATABASES", "SECRETS", "metadata", "object_annotations", "spec", "status"]


def metadata(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def spec(obj: Obj) -> dict[str, Any]:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


def status(obj: Obj) -> dict[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, dict) else {}


def object_annotations(obj: Obj) -> dict[str, str]:
    value = metadata(obj).get("annotations")
    return value if isinstance(value, dict) else {}

