"""Fixtures of the real-CLI suite: two empty apiservers and one Pulumi stack configured as the docs say.

The suite starts its own two control planes rather than using the session `kube`: the install must be proven
on an empty cluster (the docs promise what `pulumi up` needs there), the DB cluster needs the Prometheus
Operator's real ServiceMonitor CRD where tests/generator installs stand-ins, and `pulumi destroy` must be
checked on a cluster nobody else writes to. The second apiserver is the "central Prometheus" cluster.

Why a wrapper program (tests/pulumi/program/) and not Pulumi.yaml's `main: infra/` as is: see its docstring.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness import KubeControlPlane
from harness.prometheus_operator import crd_paths
from harness.pulumi import REPO_ROOT, PulumiWorkspace
from tests.support.kubeapi import KubeApi, apply_all

STACK = "eu-1"  # the stack name of the documented commands
DB_CONTEXT = "db-eu-1"  # the kubeconfig context the documented `kubernetes:context` names
PROGRAM = Path(__file__).resolve().parent / "program" / "__main__.py"


@dataclass
class Clusters:
    db: KubeControlPlane
    prometheus: KubeControlPlane
    db_api: KubeApi
    prometheus_api: KubeApi


@pytest.fixture(scope="module")
def clusters() -> Iterator[Clusters]:
    """The DB cluster and the central Prometheus' cluster, both with the Prometheus Operator's real CRDs."""
    crds = [yaml.safe_load(path.read_text()) for path in crd_paths()]
    with KubeControlPlane() as db, KubeControlPlane() as prometheus:
        with db.admin_client() as db_client, prometheus.admin_client() as prometheus_client:
            found = Clusters(db, prometheus, KubeApi(db_client), KubeApi(prometheus_client))
            apply_all(found.db_api, crds)
            apply_all(found.prometheus_api, crds)
            yield found


@pytest.fixture(scope="module")
def workspace(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> PulumiWorkspace:
    """A project directory with the repository's Pulumi.yaml (main: the wrapper) and kubeconfigs under ~/.kube."""
    workdir = tmp_path_factory.mktemp("pulumi")
    project = workdir / "project"
    (project / "program").mkdir(parents=True)
    settings = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    settings["main"] = "program/"
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(settings))
    shutil.copy(PROGRAM, project / "program" / "__main__.py")
    kube_dir = workdir / "home" / ".kube"
    kube_dir.mkdir(parents=True)
    kubeconfig = clusters.db.write_kubeconfig(kube_dir / "config")
    document = yaml.safe_load(kubeconfig.read_text())
    document["contexts"][0]["name"] = document["current-context"] = DB_CONTEXT
    kubeconfig.write_text(yaml.safe_dump(document))
    clusters.prometheus.write_kubeconfig(kube_dir / "central-prometheus.yaml")
    return PulumiWorkspace(workdir, project, kubeconfig)
