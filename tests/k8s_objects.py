"""Small readers of Kubernetes objects as dicts, shared by the controller suites."""

from __future__ import annotations

import base64
from typing import Any


def b64(value: str | bytes) -> str:
    raw = value.encode() if isinstance(value, str) else value
    return base64.b64encode(raw).decode()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The status condition of that type, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None
