"""Fixtures of the generator suite: the rendered install applied to the real kube-apiserver.

`installed` applies every manifest of TEST_CONFIG with server-side apply (CRDs first, then waits until they
are Established) and removes the cluster-scoped objects it owns afterwards, except the CRDs, which other
suites on the same apiserver may be using. Names are prefixed `gentest` so they collide with nobody.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from domain.config import InstallConfig, load_install_config
from harness.prometheus_operator import crd_paths
from infra.render import render_manifests, render_prometheus_rule
from tests.support.kubeapi import KubeApi, apply_all

RELEASE_NAMESPACE = "gentest-system"
SHARD_NS_A = "gentest-shards-a"
SHARD_NS_B = "gentest-shards-b"
OTHER_NS = "gentest-elsewhere"
BREAK_GLASS_GROUP = "gentest:break-glass"

TEST_CONFIG: dict[str, Any] = {
    "releaseName": "gentest",
    "namespace": RELEASE_NAMESPACE,
    "image": "registry.example/dbprovider:test",
    "tls": {"secretName": "gentest-tls"},
    "shardSecrets": [
        {"namespace": SHARD_NS_A, "name": "pg-a-provisioner"},
        {"namespace": SHARD_NS_A, "name": "pg-a2-provisioner"},
        {"namespace": SHARD_NS_B, "name": "pg-b-provisioner"},
        {"namespace": RELEASE_NAMESPACE, "name": "local-provisioner"},
    ],
    "sizeClasses": {"small": {"connectionLimit": 5}, "large": {"connectionLimit": 50}},
    # system:masters stays a break-glass group: other suites on this apiserver delete shards as admin.
    "deletionProtection": {"enabled": True, "breakGlassGroups": ["system:masters", BREAK_GLASS_GROUP]},
    "metrics": {
        "serviceMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "annotations": {"example.com/owner": "team-db"},
            "interval": "1m30s",
            "scrapeTimeout": "20s",
        }
    },
    "prometheusRule": {
        "enabled": True,
        "cluster": "gentest-eu1",
        "labels": {"role": "alert-rules"},
        "annotations": {"example.com/owner": "team-db"},
    },
    "engines": {"cloudberry": {"enabled": True}},
}


def monitoring_crds() -> list[dict[str, Any]]:
    """The real Prometheus Operator CRDs (ServiceMonitor, PrometheusRule), so their schemas judge our objects."""
    return [yaml.safe_load(path.read_text()) for path in crd_paths()]


def make_config(**overrides: Any) -> InstallConfig:
    data = copy.deepcopy(TEST_CONFIG)
    data.update(overrides)
    return load_install_config(data)


@dataclass
class Installed:
    admin: KubeApi
    config: InstallConfig
    manifests: list[dict[str, Any]]
    applied: list[dict[str, Any]]  # what the apiserver returned for each manifest


@pytest.fixture(scope="module")
def installed(kube: Any) -> Iterator[Installed]:
    config = make_config()
    for namespace in (RELEASE_NAMESPACE, SHARD_NS_A, SHARD_NS_B, OTHER_NS):
        kube.ensure_namespace(namespace)
    with kube.admin_client() as client:
        api = KubeApi(client)
        apply_all(api, monitoring_crds())
        manifests = render_manifests(config) + [render_prometheus_rule(config)]
        applied = apply_all(api, manifests)
        try:
            yield Installed(admin=api, config=config, manifests=manifests, applied=applied)
        finally:
            cleanup = [m for m in manifests if m["kind"] != "CustomResourceDefinition"]
            for obj in reversed(cleanup):
                api.delete(obj)
