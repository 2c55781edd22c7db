"""The Pulumi stack config, read once: the install config's keys under the `dbprovider:` namespace.

    pulumi config set dbprovider:namespace databases
    pulumi config set --path --plaintext dbprovider:tls.secretName dbprovider-tls
    pulumi config set --path 'dbprovider:shardSecrets[0].namespace' databases
    pulumi config set --path --plaintext 'dbprovider:shardSecrets[0].name' pg-shard01-pguser-provisioner

Every top-level key of the install config (domain.config.InstallConfig, camelCase) is one stack config
key; nested keys are structured config. Three keys exist only for Pulumi:

    dbprovider:prometheusKubeconfig  kubeconfig (contents or path; set it --secret) of the cluster that runs
                                     the central Prometheus; the PrometheusRule is created there.
    dbprovider:prometheusNamespace   namespace of the PrometheusRule in that cluster (default: the release
                                     namespace).
    dbprovider:dashboardConfigMap    true: also create the dashboard's ConfigMap for a Grafana sidecar in the
                                     DB cluster, the object `dbprovider render --only dashboard --format
                                     configmap` writes (default false: the dashboard is a stack output only).

An unknown `dbprovider:` key or an invalid value stops the program with a message naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from domain.config import ConfigError, InstallConfig, load_install_config
from domain.naming import is_dns1123_label

CONFIG_NAMESPACE = "dbprovider"
KEY_PROMETHEUS_KUBECONFIG = "prometheusKubeconfig"
KEY_PROMETHEUS_NAMESPACE = "prometheusNamespace"
KEY_DASHBOARD_CONFIGMAP = "dashboardConfigMap"
PULUMI_ONLY_KEYS = (KEY_PROMETHEUS_KUBECONFIG, KEY_PROMETHEUS_NAMESPACE, KEY_DASHBOARD_CONFIGMAP)


def install_config_keys() -> dict[str, bool]:
    """Top-level install config keys (camelCase) -> True if the value is a plain string."""
    properties = InstallConfig.model_json_schema(by_alias=True)["properties"]
    return {key: schema.get("type") == "string" for key, schema in properties.items()}


@dataclass(frozen=True)
class StackConfig:
    """Everything the program needs from the stack config."""

    install: InstallConfig
    prometheus_kubeconfig: pulumi.Input[str] | None = None
    prometheus_namespace: str | None = None
    dashboard_configmap: bool = False


class StackConfigError(pulumi.RunError):
    """Invalid stack config; the message names every offending `dbprovider:` key."""

    def __init__(self, problems: tuple[tuple[str, str], ...]) -> None:
        self.problems = problems
        details = "; ".join(f"{CONFIG_NAMESPACE}:{path}: {msg}" if path else msg for path, msg in problems)
        super().__init__(f"invalid stack config: {details}")


def _configured_keys() -> set[str]:
    """The `dbprovider:` keys set in this stack (from the engine's config and PULUMI_CONFIG)."""
    from pulumi.runtime import config as runtime_config

    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    prefix = f"{CONFIG_NAMESPACE}:"
    return {key[len(prefix) :] for key in keys if key.startswith(prefix)}


def _install_values(cfg: pulumi.Config) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    values: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for key, plain in install_config_keys().items():
        if cfg.get(key) is None:
            continue
        if plain:
            values[key] = cfg.get(key)
            continue
        try:
            values[key] = cfg.get_object(key)
        except pulumi.ConfigTypeError:
            problems.append((key, "is not valid structured config (a number, boolean, list or object)"))
    return values, problems


def load_stack_config(cfg: pulumi.Config | None = None) -> StackConfig:
    """Read and validate the stack config; raise StackConfigError naming each offending key."""
    cfg = cfg or pulumi.Config(CONFIG_NAMESPACE)
    known = set(install_config_keys()) | set(PULUMI_ONLY_KEYS)
    problems = [(key, "is not a known key") for key in sorted(_configured_keys() - known)]
    values, value_problems = _install_values(cfg)
    problems.extend(value_problems)
    install: InstallConfig | None = None
    try:
        install = load_install_config(values)
    except ConfigError as exc:
        problems.extend(exc.problems)
    namespace = cfg.get(KEY_PROMETHEUS_NAMESPACE)
    if namespace is not None and not is_dns1123_label(namespace):
        problems.append((KEY_PROMETHEUS_NAMESPACE, "must be a namespace name (a DNS label)"))
    dashboard_configmap = False
    try:
        dashboard_configmap = bool(cfg.get_bool(KEY_DASHBOARD_CONFIGMAP))
    except pulumi.ConfigTypeError:
        problems.append((KEY_DASHBOARD_CONFIGMAP, "must be true or false"))
    if problems or install is None:
        raise StackConfigError(tuple(problems))
    kubeconfig: pulumi.Input[str] | None = None
    if cfg.get(KEY_PROMETHEUS_KUBECONFIG) is not None:
        kubeconfig = cfg.get_secret(KEY_PROMETHEUS_KUBECONFIG)
    return StackConfig(
        install=install,
        prometheus_kubeconfig=kubeconfig,
        prometheus_namespace=namespace,
        dashboard_configmap=dashboard_configmap,
    )
