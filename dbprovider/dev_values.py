"""The install config of `dbprovider dev`: dev's defaults with the user's own values merged on top.

Merging: mappings are merged key by key (so a values file that sets only `softDelete.retention` keeps
dev's size classes), anything else (lists, scalars) replaces dev's value. The result is validated by
domain.config's parser like any install config, so keys other changes add are accepted here too.

Some values are valid but cannot work on the local stack; they are refused with the key's name
(LOCAL_REFUSALS) rather than failing half-way through the install. Everything not listed there works
locally: new keys need no change here unless they need something the local stack lacks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from domain.config import ConfigError, InstallConfig, load_install_config, read_install_values

DEV_CONFIG: dict[str, Any] = {
    "releaseName": "dbprovider",
    "namespace": "dbprovider",
    "tls": {"secretName": "dbprovider-tls"},
    "sizeClasses": {
        "small": {"connectionLimit": 5},
        "medium": {"connectionLimit": 20},
        "large": {"connectionLimit": 50},
    },
    "connectionLimit": {"default": 10},
    "softDelete": {"retention": "2m"},
}

# (key, is it set to something the local stack cannot do, why not / what to do instead)
LOCAL_REFUSALS: tuple[tuple[str, Callable[[InstallConfig], bool], str], ...] = (
    (
        "metrics.serviceMonitor.enabled",
        lambda config: config.metrics.service_monitor.enabled,
        "a ServiceMonitor needs the Prometheus Operator's CRDs, which the local stack does not have; set it to "
        "false in the values you give dev (the manager's metrics are served on localhost anyway)",
    ),
    (
        "shardTLS.caBundle",
        lambda config: config.shard_tls.ca_bundle is not None,
        "the bundle is mounted into the provider's pod, and dev runs the manager on this machine without it; "
        "leave it out of the values you give dev (dev's own shard uses sslmode require, which needs no CA)",
    ),
)


class NotRunnableLocally(ConfigError):
    """Valid install values that the local stack cannot honour; `problems` names each key."""

    def __init__(self, problems: tuple[tuple[str, str], ...]) -> None:
        super().__init__(problems)
        details = "; ".join(f"{path}: {msg}" for path, msg in problems)
        self.args = (f"cannot work locally: {details}",)


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`: mappings merged recursively, everything else replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read_dev_values(path: str) -> dict[str, Any]:
    """The user's values file (unvalidated; validated once merged)."""
    data = read_install_values(path)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError((("", f"{path} must be a mapping of install config keys"),))
    return dict(data)


def checked_dev_values(path: str | None) -> dict[str, Any]:
    """`dbprovider dev --config PATH`: the user's values, checked merged onto dev's defaults before dev imports
    or starts anything, so a key that cannot work is refused at once. ConfigError names every such key."""
    if path is None:
        return {}
    overrides = read_dev_values(path)
    dev_install_config(overrides)
    return overrides


def dev_install_config(overrides: Mapping[str, Any]) -> InstallConfig:
    """dev's defaults with `overrides` merged on; ConfigError names every invalid or locally impossible key."""
    config = load_install_config(merge_values(DEV_CONFIG, overrides))
    problems = tuple((key, why) for key, refused, why in LOCAL_REFUSALS if refused(config))
    if problems:
        raise NotRunnableLocally(problems)
    return config
