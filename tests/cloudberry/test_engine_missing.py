"""An optional engine whose CRD is missing keeps no replica from starting and no API from serving.

`engines.cloudberry.enabled` with the Keldon DatabaseCluster CRD absent (not installed yet, or removed):
a `dbprovider manager` process starts and answers /readyz 200, a restart does too, and postgres
databases converge; the cloudberry Shard says EngineUnavailable and dbprovider_engine_available is 0.
Once the CRD is installed, the cloudberry shard is checked and Ready without a restart.

Its own kube-apiserver (the CRD is removed, which other suites on the shared one rely on), a real
PostgreSQL 18 and manager subprocesses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dbprovider.devstack import DevStack
from domain.resources import DATABASE_CLUSTERS, DATABASES, SHARDS
from harness import KubeControlPlane
from harness.keldon import KELDON_CRD, KELDON_CRD_NAME, RUNNING
from informers import Resource, Rest
from tests.support.common import condition, wait_for
from tests.support.devstack import install_stack
from tests.support.fleet import gone, ignore_missing
from tests.support.kubeapi import KubeApi, crd_established
from tests.support.replica import ManagerReplica

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
READY_WITHIN = 20.0  # seconds from process start to /readyz 200 (the sync bound was 60 s, then an exit)


@pytest.fixture(scope="module")
def stack(postgres_pool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    root = tmp_path_factory.mktemp("engine-missing")
    (root / "kube").mkdir()
    kube = KubeControlPlane(workdir=root / "kube").start()
    try:
        created = install_stack(
            kube,
            postgres_pool.get("18"),
            root / "stack",
            "cbmissing",
            softDelete={"retention": "0"},
            engines={"cloudberry": {"enabled": True}},
        )
        with kube.admin_client() as client:
            rest = Rest(client)
            rest.delete(CRDS, KELDON_CRD_NAME)  # install() put it there; this install has none
            wait_for(lambda: gone(rest, CRDS, KELDON_CRD_NAME), 60, "the Keldon CRD gone")
        yield created
    finally:
        kube.close()


def _replica(stack: DevStack, name: str, root: Path) -> tuple[ManagerReplica, float]:
    started = time.monotonic()
    replica = ManagerReplica(stack, name, root)
    replica.wait_ready(timeout=READY_WITHIN)
    return replica, time.monotonic() - started


def test_a_missing_optional_crd_keeps_nothing_else_from_running(stack: DevStack, tmp_path: Path) -> None:
    cluster, cloudberry_shard = stack.cloudberry_objects("cbmissing-cb")
    with stack.kube.admin_client() as client:
        rest = Rest(client)
        rest.create(SHARDS, cloudberry_shard)
        first, took = _replica(stack, "cbmissing-a", tmp_path)
        try:
            assert took < READY_WITHIN
            answer = first.call("PUT", "/v1/databases/orders", json={})
            assert answer.status_code == 201, answer.text
            wait_for(
                lambda: any(
                    (db.get("status") or {}).get("phase") == "Ready"
                    for db in rest.list(DATABASES, stack.namespace)["items"]
                ),
                60,
                "the postgres database Ready",
            )

            def engine_unavailable() -> dict | None:
                shard = rest.get(SHARDS, "cbmissing-cb")
                return shard if (condition(shard, "Ready") or {}).get("reason") == "EngineUnavailable" else None

            shard = wait_for(engine_unavailable, 60, "the cloudberry shard to say EngineUnavailable")
            assert "HTTP 404" in condition(shard, "Ready")["message"]
            metrics = first.metrics()
            assert 'dbprovider_engine_available{engine="cloudberry"} 0.0' in metrics
        finally:
            first.stop()

        # A restart (a rollout) serves at once again, and the next database converges too.
        second, took = _replica(stack, "cbmissing-b", tmp_path)
        try:
            assert took < READY_WITHIN
            assert second.call("PUT", "/v1/databases/invoices", json={}).status_code == 201
            wait_for(
                lambda: (
                    sum(
                        (db.get("status") or {}).get("phase") == "Ready"
                        for db in rest.list(DATABASES, stack.namespace)["items"]
                    )
                    == 2
                ),
                60,
                "both postgres databases Ready",
            )

            # Keldon is installed now: its shard is checked and Ready without a restart.
            api = KubeApi(client)
            api.apply(KELDON_CRD)
            wait_for(lambda: crd_established(api, KELDON_CRD_NAME), 60, "the DatabaseCluster CRD")
            rest.create(DATABASE_CLUSTERS, cluster, stack.namespace)
            rest.patch(
                DATABASE_CLUSTERS,
                cluster["metadata"]["name"],
                {"status": {"phase": RUNNING}},
                stack.namespace,
                subresource="status",
            )
            wait_for(
                lambda: (condition(rest.get(SHARDS, "cbmissing-cb"), "Ready") or {}).get("reason") == "Ok",
                90,
                "the cloudberry shard Ready once the CRD is served",
            )
            metrics = second.metrics()
            assert 'dbprovider_engine_available{engine="cloudberry"} 1.0' in metrics
        finally:
            second.stop()
            ignore_missing(lambda: rest.delete(SHARDS, "cbmissing-cb"))
