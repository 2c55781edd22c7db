"""`dbprovider move check` as a platform engineer runs it: the Shards, their admin Secrets and the
Database read from a real apiserver, the shards' catalogs from real PostgreSQL (the harness' servers,
which are not prepared for online moves), the command a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.constants import API_VERSION
from harness import POSTGRES_FLAVORS, KubeControlPlane, PostgresServer
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
    config = release_config(
        RELEASE, NAMESPACE, shardSecrets=[{"namespace": NAMESPACE, "name": SECRET}], moves={"offlineMaxSize": "1Mi"}
    )
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


def _run(
    kube: KubeControlPlane, tmp_path: Path, *args: str, tools: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command, with `tools` (DBPROVIDER_PG_DUMP, DBPROVIDER_PG_RESTORE) in its environment."""
    kubeconfig = kube.write_kubeconfig(tmp_path / "admin.kubeconfig")
    argv = [sys.executable, "-m", "dbprovider.cli", "move", "check", "--kubeconfig", str(kubeconfig)]
    argv += ["--namespace", NAMESPACE, "--release", RELEASE, "--admin-host-override", "127.0.0.1", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("DBPROVIDER_PG_DUMP", "DBPROVIDER_PG_RESTORE")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, **(tools or {})})


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
        tools = {"DBPROVIDER_PG_DUMP": str(server.bin_dir / "pg_dump")}  # the pg_restore beside it
        out = _run(kube, tmp_path, "--shard", source, "--target", target, "--database", name, tools=tools)
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        for shard in (source, target):
            assert (
                f"shard {shard}: wal_level is replica: set wal_level = logical (needs a server restart) [wal_level]"
                in (lines)
            )
            assert any(line.startswith(f"shard {shard}: ") and "[create_subscription]" in line for line in lines)
        assert f"database {name}: 1 table(s) without a primary key or replica identity (public.audit)" in out.stdout
        assert "online move not possible: 7 obstacle(s)" in lines
        # The offline path: the copy tools against both shards' majors, the database's size against the limit.
        major = server.major
        bin_dir = server.bin_dir
        assert (
            f"offline: pg_dump {bin_dir / 'pg_dump'} and pg_restore {bin_dir / 'pg_restore'} of PostgreSQL {major} "
            f"copy from shard {source} (PostgreSQL {major}) to shard {target} (PostgreSQL {major})"
        ) in lines
        too_big = [line for line in lines if line.startswith("offline: the database is ")]
        assert len(too_big) == 1 and "above moves.offlineMaxSize 1 MiB" in too_big[0], lines
        assert "spec.force: true [offline_size]" in too_big[0]
        assert lines[-1] == "offline move not possible: 1 obstacle(s)"
        assert server.provisioner_password not in out.stdout + out.stderr

        shards_only = _run(kube, tmp_path, "--shard", source, "--target", target, tools=tools)
        assert shards_only.returncode == 1, shards_only.stdout
        assert "offline: databases up to moves.offlineMaxSize 1 MiB are moved without spec.force" in shards_only.stdout
        assert shards_only.stdout.splitlines()[-1] == f"offline move possible from shard {source} to shard {target}"
        # Only tools of another major (none on PATH, none in the per-major directory): none to copy with.
        other = "18" if major == 15 else "15"
        unfit_tools = {
            "DBPROVIDER_PG_DUMP": str(POSTGRES_FLAVORS[other].locate() / "pg_dump"),
            "DBPROVIDER_PG_TOOLS": str(tmp_path / "no-tools"),
            "PATH": str(tmp_path / "no-tools"),
        }
        unfit = _run(kube, tmp_path, "--shard", source, "--target", target, tools=unfit_tools)
        assert any(
            line.startswith(f"offline: no pg_dump of PostgreSQL {major} where the manager runs")
            and line.endswith("[binaries]")
            for line in unfit.stdout.splitlines()
        ), unfit.stdout
        assert unfit.stdout.splitlines()[-1] == "offline move not possible: 1 obstacle(s)"

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
