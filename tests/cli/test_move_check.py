"""`dbprovider move check` as a platform engineer runs it: the Shards, their admin Secrets and the
Database read from a real apiserver, the shards' catalogs from real PostgreSQL (the harness' servers,
which are not prepared for online moves), the command a subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.constants import API_VERSION
from harness import KubeControlPlane, PostgresServer
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import ensure_tenant
from tests.sql.helpers import admin_endpoint, new_spec
from tests.support.common import b64, shard_object, unique
from tests.support.install import release_config
from tests.support.kubeapi import KubeApi, apply_all
from tests.support.postgres import PG_FLAVORS, PostgresPool, drop_as_superuser

RELEASE = "movecheck"
NAMESPACE = "movecheck-system"
SECRET = "movecheck-provisioner"
MODERN = [f for f in PG_FLAVORS if int(f) >= 16]


@pytest.fixture(scope="module")
def installed(kube: KubeControlPlane) -> Iterator[KubeApi]:
    """The CRDs, the release's ConfigMap listing the admin Secret, and nothing else of an install."""
    from domain.config import load_install_config
    from infra.render import render_manifests

    kube.ensure_namespace(NAMESPACE)
    config = release_config(RELEASE, NAMESPACE, shardSecrets=[{"namespace": NAMESPACE, "name": SECRET}])
    with kube.admin_client() as client:
        api = KubeApi(client)
        manifests = render_manifests(load_install_config(config))
        apply_all(api, [m for m in manifests if m["kind"] == "CustomResourceDefinition"])
        apply_all(api, [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-config")])
        yield api


@pytest.fixture
def server(postgres_pool: PostgresPool) -> PostgresServer:
    if not MODERN:
        pytest.fail("move check needs a PostgreSQL 16 or later flavor")
    return postgres_pool.get(MODERN[0])


def _secret(server: PostgresServer) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {"user": b64(server.PROVISIONER), "password": b64(server.provisioner_password)},
    }


def _shard(name: str, server: PostgresServer) -> dict[str, Any]:
    return shard_object(
        name,
        {
            "maxDatabases": 10,
            "perconaCluster": {"namespace": NAMESPACE, "name": name},
            "admin": {
                "serviceName": "pg",
                "port": server.port,
                "sslmode": "require",
                "secretRef": {"namespace": NAMESPACE, "name": SECRET},
            },
            "client": {"host": "127.0.0.1", "port": server.port},
        },
    )


def _run(kube: KubeControlPlane, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = kube.write_kubeconfig(tmp_path / "admin.kubeconfig")
    argv = [sys.executable, "-m", "dbprovider.cli", "move", "check", "--kubeconfig", str(kubeconfig)]
    argv += ["--namespace", NAMESPACE, "--release", RELEASE, "--admin-host-override", "127.0.0.1", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_move_check_reads_the_cluster_and_names_what_each_shard_and_the_database_lack(
    kube: KubeControlPlane, installed: KubeApi, server: PostgresServer, tmp_path: Path
) -> None:
    api = installed
    source, target = unique("movecheck-a"), unique("movecheck-b")
    spec = new_spec()
    with AdminSession.for_endpoint(admin_endpoint(server)) as admin:
        ensure_tenant(admin, spec)
    with server.connect(spec.name, spec.password, spec.name, autocommit=True) as conn:
        conn.execute("CREATE TABLE audit (line text)")
    database = {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {"name": unique("orders"), "namespace": NAMESPACE},
        "spec": {"consumer": "team", "externalId": "orders"},
    }
    objects = [_secret(server), _shard(source, server), _shard(target, server), database]
    try:
        for obj in objects:
            created = api.create(obj)
            assert created.status == 201, created.message
        placed = {"status": {"phase": "Ready", "shard": source, "tenantName": spec.name}}
        assert api.merge_patch(database, placed, "status").status == 200

        name = database["metadata"]["name"]
        out = _run(kube, tmp_path, "--shard", source, "--target", target, "--database", name)
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        for shard in (source, target):
            assert (
                f"shard {shard}: wal_level is replica: set wal_level = logical (needs a server restart) [wal_level]"
                in (lines)
            )
            assert any(line.startswith(f"shard {shard}: ") and "[create_subscription]" in line for line in lines)
        assert f"database {name}: 1 table(s) without a primary key or replica identity (public.audit)" in out.stdout
        assert lines[-1] == "online move not possible: 7 obstacle(s)"
        assert server.provisioner_password not in out.stdout + out.stderr

        missing = _run(kube, tmp_path, "--shard", source, "--target", "movecheck-nowhere")
        assert (missing.returncode, missing.stdout) == (2, "error: no Shard movecheck-nowhere\n")
        elsewhere = _run(kube, tmp_path, "--shard", target, "--target", source, "--database", name)
        assert (elsewhere.returncode, elsewhere.stdout) == (
            2,
            f"error: Database {name} is not placed on shard {target}\n",
        )
    finally:
        for obj in reversed(objects):
            api.delete(obj)
        drop_as_superuser(server, spec.name)
