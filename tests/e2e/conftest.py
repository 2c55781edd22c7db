"""What the end-to-end modules share: an admin client (each installs a DevStack release of its own
with tests.support.devstack.install_stack)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import KubeControlPlane
from informers import Rest


@pytest.fixture(scope="module")
def admin(kube: KubeControlPlane) -> Iterator[Rest]:
    with kube.admin_client() as client:
        yield Rest(client)
