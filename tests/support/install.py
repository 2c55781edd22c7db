"""A test release of the provider on the shared apiserver, and the fixtures of the suites that run one.

The API, reconciler and Cloudberry suites each install the provider under a release of their own
(names prefixed `apitest`, `rectest`, `cbtest`) so they collide with nobody on the one apiserver of
a run. `release_fixtures(release)` makes the fixtures a controller suite needs for its release; the
suite's conftest binds them to their names:

    installed, provider_client, admin_rest, start_manager, fleet = release_fixtures(RELEASE)

They are made per suite, not defined once in a plugin, because pytest caches a session fixture
once per definition: one shared `installed` would hand the first suite's install to the second.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Unpack

import pytest
from kubernetes.client import ApiClient

from domain.config import InstallConfig, load_install_config
from harness import KubeControlPlane
from informers import Rest
from infra.render import render_manifests
from tests.support.admin_secrets import shard_secrets
from tests.support.in_process_manager import InProcessManager, ReplicaOptions
from tests.support.kubeapi import KubeApi, apply_all


def release_config(release: str, namespace: str, **settings: Any) -> dict[str, Any]:
    """The install config the test releases start from: two size classes, a default connection
    limit, and no admission policy (it would apply to every Shard on the shared apiserver)."""
    return {
        "releaseName": release,
        "namespace": namespace,
        "tls": {"secretName": f"{release}-tls"},
        "sizeClasses": {"small": {"connectionLimit": 5}, "large": {"connectionLimit": 50}},
        "connectionLimit": {"default": 10},
        "deletionProtection": {"enabled": False},
        **settings,
    }


@dataclass(frozen=True)
class Release:
    """One test install: its release name, namespaces and the settings it adds to `release_config`.

    Shard admin Secrets are listed in shardSecrets (slots of tests.support.admin_secrets) in
    `shard_secrets_namespace`.
    """

    name: str
    namespace: str
    shard_secrets_namespace: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def base_config(self) -> dict[str, Any]:
        return release_config(
            self.name,
            self.namespace,
            shardSecrets=shard_secrets(self.name, self.shard_secrets_namespace),
            softDelete={"retention": "0"},
            **copy.deepcopy(self.settings),
        )

    def config(self, **overrides: Any) -> InstallConfig:
        """The release's install config with top-level keys replaced."""
        return load_install_config({**self.base_config, **overrides})

    def manifests(self) -> list[dict[str, Any]]:
        return render_manifests(self.config())

    def install(self, kube: KubeControlPlane) -> KubeApi:
        """CRDs, RBAC and the rest of the install, applied with server-side apply."""
        kube.ensure_namespace(self.namespace)
        kube.ensure_namespace(self.shard_secrets_namespace)
        api = KubeApi(kube.admin_client())
        apply_all(api, self.manifests())
        return api

    def manager(
        self, client: ApiClient, identity: str, config: InstallConfig | None = None, **options: Unpack[ReplicaOptions]
    ) -> InProcessManager:
        """The controllers of one replica of this release, in this process (not started)."""
        lease = f"{self.name}-manager"
        return InProcessManager(client, config or self.config(), self.namespace, lease, identity, **options)


def release_fixtures(release: Release, fleet_class: Callable[[Rest], Any]) -> tuple[Any, ...]:
    """(installed, provider_client, admin_rest, start_manager, fleet) for `release`.

    `fleet_class(admin_rest)` makes the per-test fleet; its `cleanup()` runs when the test ends.
    """

    @pytest.fixture(scope="session")
    def installed(kube: KubeControlPlane) -> KubeApi:
        """The install of the release, applied once per run."""
        return release.install(kube)

    @pytest.fixture(scope="session")
    def provider_client(kube: KubeControlPlane, installed: KubeApi) -> ApiClient:
        """A client authenticated as the provider's ServiceAccount (real TokenRequest token)."""
        return kube.service_account_client(release.namespace, release.name)

    @pytest.fixture(scope="session")
    def admin_rest(kube: KubeControlPlane, installed: KubeApi) -> Rest:
        return Rest(kube.admin_client())

    @pytest.fixture
    def start_manager(provider_client: ApiClient) -> Iterator[Callable[..., InProcessManager]]:
        """Starts replicas (waiting until they lead, unless told not to); stops them after the test."""
        started: list[InProcessManager] = []
        counter = itertools.count()

        def start(
            config: InstallConfig | None = None, wait_leading: bool = True, **options: Unpack[ReplicaOptions]
        ) -> InProcessManager:
            identity = f"{release.name}-{next(counter)}"
            manager = release.manager(provider_client, identity, config, **options)
            started.append(manager.start(wait_leading))
            return manager

        yield start
        for manager in reversed(started):
            manager.stop()

    @pytest.fixture
    def fleet(admin_rest: Rest) -> Iterator[Any]:
        created = fleet_class(admin_rest)
        yield created
        created.cleanup()

    return installed, provider_client, admin_rest, start_manager, fleet
