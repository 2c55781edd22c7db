"""The small helpers every suite uses: polling, unique names, base64, status conditions.

One copy, so a fix to polling (say, a clearer timeout message) reaches every suite.
"""

from __future__ import annotations

import base64
import itertools
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from domain.constants import API_VERSION, KIND_SHARD

T = TypeVar("T")

_names = itertools.count(1)


def wait_for(
    check: Callable[[], T], timeout: float = 30.0, what: str = "", *, interval: float = 0.02, max_interval: float = 0.25
) -> T:
    """Poll `check` until it returns something truthy (returned); fail naming `what` after `timeout` s.

    The pause starts at `interval` and doubles up to `max_interval`: quick for what happens at once,
    gentle on the shared apiserver for what takes a while.
    """
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or check}")
        time.sleep(delay)
        delay = min(delay * 2, max(max_interval, interval))


def unique(prefix: str) -> str:
    """A name no other test (nor an earlier run on the same apiserver) uses."""
    return f"{prefix}-{next(_names)}-{secrets.token_hex(3)}"


def b64(value: str | bytes) -> str:
    """Base64 text, as a Secret's `data` holds it."""
    raw = value.encode() if isinstance(value, str) else value
    return base64.b64encode(raw).decode()


def now_stamp() -> str:
    """The current time as the provider writes timestamps (RFC 3339, whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    """A Secret's `data`, decoded."""
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The status condition of that type, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def shard_object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Shard object named `name` with `spec`, as a test creates it."""
    return {"apiVersion": API_VERSION, "kind": KIND_SHARD, "metadata": {"name": name}, "spec": spec}
