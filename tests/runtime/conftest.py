"""Fixtures of the runtime suite: admin REST client, a namespace per test, our test CRD."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import KubeControlPlane
from informers import Rest
from tests.runtime.support import ensure_crd
from tests.support.common import unique


@pytest.fixture(scope="session")
def admin_rest(kube: KubeControlPlane) -> Iterator[Rest]:
    with kube.admin_client() as api:
        yield Rest(api)


@pytest.fixture
def namespace(kube: KubeControlPlane) -> str:
    """A fresh namespace per test (nothing deletes namespaces here: no controller-manager)."""
    name = unique("rt")
    kube.ensure_namespace(name)
    return name


@pytest.fixture(scope="session")
def widgets_crd(admin_rest: Rest) -> None:
    ensure_crd(admin_rest)
