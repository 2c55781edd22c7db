"""The body of a core/v1 Event about one of our objects: written once for the controllers and the agent.

Messages are cut to 1,024 characters; callers never put a password, hash or token in them.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

MESSAGE_MAX = 1024


def event_body(
    involved: Mapping[str, Any], reason: str, message: str, *, warning: bool, component: str, instance: str, now: str
) -> dict[str, Any]:
    """An Event about `involved` (its involvedObject: apiVersion, kind, name, namespace, uid...) at `now`."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{secrets.token_hex(8)}", "namespace": involved["namespace"]},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
