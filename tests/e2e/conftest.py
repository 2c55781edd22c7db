"""What the end-to-end modules share: a DevStack release of their own on the session's apiserver, and an
admin client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dbprovider.devstack import DevStack
from harness import KubeControlPlane, PostgresServer
from informers import Rest


def install_stack(kube: KubeControlPlane, postgres: PostgresServer, workdir: Path, release: str,
                  **overrides: Any) -> DevStack:
    """The product installed as release `release` (namespace `<release>-system`), with its Shard on
    `postgres` and a Consumer; deletion protection off, so the test can remove what it made."""
    return DevStack(
        kube, postgres, workdir,
        config_overrides={
            "releaseName": release, "namespace": f"{release}-system", "tls": {"secretName": f"{release}-tls"},
            "deletionProtection": {"enabled": False}, **overrides,
        },
        consumer=f"{release}-consumer", shard=f"{release}-pg",
    ).install()


@pytest.fixture(scope="module")
def admin(kube: KubeControlPlane) -> Iterator[Rest]:
    with kube.admin_client() as client:
        yield Rest(client)
