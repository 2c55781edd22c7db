"""Objects as the apiserver stores them, for the unit tests of domain.objects and the status writes."""

from __future__ import annotations

from typing import Any

# A Ready Database's status as stored: camelCase, the stored time format.
STORED_STATUS: dict[str, Any] = {
    "phase": "Ready",
    "shard": "shard-a",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Provisioned",
            "message": "",
            "lastTransitionTime": "2026-12-01T10:00:00Z",
        }
    ],
}
