"""A DevStack release of a suite's own on the shared apiserver (the suites that run `dbprovider manager`
processes against it: e2e, faults, cloudberry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dbprovider.devstack import DevStack
from domain.resources import CONSUMERS, SHARDS
from harness import KubeControlPlane, PostgresServer
from harness.patroni import PatroniShard
from informers import Rest
from tests.support.fleet import ignore_missing


def install_stack(
    kube: KubeControlPlane,
    postgres: PostgresServer | PatroniShard,
    workdir: Path,
    release: str,
    *,
    shard: str | None = None,
    **overrides: Any,
) -> DevStack:
    """The product installed as release `release` (namespace `<release>-system`), with its Shard
    (`<release>-pg` unless named) on `postgres` (a Patroni cluster: its pgBouncer the client endpoint) and a
    Consumer; deletion protection off, so the test
    can remove what it made. `overrides` are install config keys."""
    return DevStack(
        kube,
        postgres,
        workdir,
        config_overrides={
            "releaseName": release,
            "namespace": f"{release}-system",
            "tls": {"secretName": f"{release}-tls"},
            "deletionProtection": {"enabled": False},
            **overrides,
        },
        consumer=f"{release}-consumer",
        shard=shard or f"{release}-pg",
    ).install()


def remove_stack(kube: KubeControlPlane, stack: DevStack) -> None:
    """Delete the stack's cluster-scoped Shard and Consumer once its provider has stopped, finalizers included
    (no provider of that release is left to release them): other suites' installs on the same apiserver
    must not meet them."""
    with kube.admin_client() as client:
        rest = Rest(client)
        for resource, name in ((SHARDS, stack.shard), (CONSUMERS, stack.consumer)):
            ignore_missing(lambda: rest.delete(resource, name))  # noqa: B023 (called at once)
            ignore_missing(lambda: rest.patch(resource, name, {"metadata": {"finalizers": None}}))  # noqa: B023
