"""What `lint --kubeconfig` reads from a running DB cluster: how many databases each Shard already holds.

Read-only: one GET per Shard named in the merge request; the count is the provider's own
`status.databaseCount` (the slots in use, as `kubectl get shards` shows them).
"""

from __future__ import annotations

from collections.abc import Iterable

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from urllib3.exceptions import HTTPError

from domain.objects import lenient_status
from domain.resources import SHARDS
from domain.status import ShardStatus
from informers import Rest


class LiveClusterError(RuntimeError):
    """The cluster could not be read; the message names the error class only (no server text)."""


def placed_databases(kubeconfig: str, shard_names: Iterable[str]) -> dict[str, int]:
    """Shard name -> databases placed on it, for the Shards that exist in the cluster."""
    counts: dict[str, int] = {}
    try:
        with kubernetes.config.new_client_from_config(config_file=kubeconfig) as client:
            rest = Rest(client)
            for name in shard_names:
                try:
                    shard = rest.get(SHARDS, name)
                except ApiException as exc:
                    if exc.status == 404:
                        continue  # a new Shard: nothing placed yet
                    raise LiveClusterError(f"reading Shard {name} failed with HTTP {exc.status}") from None
                count = lenient_status(ShardStatus, shard).database_count
                if count is not None:
                    counts[name] = count
    except (ConfigException, HTTPError, OSError, ValueError, TypeError) as exc:
        raise LiveClusterError(f"cannot read the cluster: {type(exc).__name__}") from None
    return counts
