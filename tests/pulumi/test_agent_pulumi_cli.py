"""`pulumi up / destroy` of the agent's component (infra.agent_component.DbProviderAgent) with the real CLI.

docs/consumers.md's Pulumi project as written (its Pulumi.yaml, its `__main__.py` reading the documented
`agent.yaml`, its `pulumi` lines) on an empty real apiserver, the consumer cluster, with a `file://`
backend. The live objects are compared with `dbprovider render --agent` of the same `agent.yaml`, never
with Pulumi's state. The program runs under the suite's wrapper (program/__main__.py) for the reason its
docstring gives; the comparison ignores exactly the annotations it adds. The tests run in file order.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.constants import API_VERSION
from harness import KubeControlPlane
from harness.prometheus_operator import crd_paths
from harness.pulumi import REPO_ROOT, PulumiWorkspace, output
from tests.pulumi.conftest import PROGRAM
from tests.pulumi.live import assert_live_equals_render, live, versions
from tests.support.documented import file_block, marked_lines
from tests.support.kubeapi import KubeApi, apply_all

CONSUMERS_DOC = REPO_ROOT / "docs" / "consumers.md"
THIS_TEST = "tests/pulumi/test_agent_pulumi_cli.py"
AGENT_NAMESPACE = "dbprovider-agent"  # the documented agent.yaml's
pytestmark = pytest.mark.server  # its own apiserver


@dataclass
class Consumer:
    kube: KubeControlPlane
    api: KubeApi
    workspace: PulumiWorkspace


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consumer]:
    """An empty consumer cluster (with the Prometheus Operator's CRDs, as a cluster that scrapes has) and the
    documented project: Pulumi.yaml (main: the wrapper), __main__.py and agent.yaml side by side."""
    workdir = tmp_path_factory.mktemp("agent-pulumi")
    project = workdir / "project"
    (project / "program").mkdir(parents=True)
    settings = yaml.safe_load(file_block(CONSUMERS_DOC, "Pulumi.yaml"))
    settings["main"] = "program/"
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(settings))
    shutil.copy(PROGRAM, project / "program" / "__main__.py")
    (project / "__main__.py").write_text(file_block(CONSUMERS_DOC, "__main__.py"))
    (project / "agent.yaml").write_text(file_block(CONSUMERS_DOC, "agent.yaml"))
    with KubeControlPlane() as kube, kube.admin_client() as client:
        api = KubeApi(client)
        apply_all(api, [yaml.safe_load(path.read_text()) for path in crd_paths()])
        workspace = PulumiWorkspace(workdir, project, kube.write_kubeconfig(workdir / "kubeconfig"))
        workspace.env["DBPROVIDER_WRAPPED_PROGRAM"] = str(project / "__main__.py")
        yield Consumer(kube, api, workspace)


def render_agent(workspace: PulumiWorkspace) -> list[dict[str, Any]]:
    """`dbprovider render --agent` (the console script) of the project's agent.yaml, parsed."""
    command = [str(Path(sys.executable).parent / "dbprovider"), "render", "--agent", "--config", "agent.yaml"]
    result = subprocess.run(command, cwd=workspace.project_dir, capture_output=True, text=True, check=True, timeout=120)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def installed(consumer: Consumer) -> Consumer:
    """The agent's namespace (docs/consumers.md creates it first), the documented `pulumi` lines, `pulumi up`."""
    consumer.kube.ensure_namespace(AGENT_NAMESPACE)
    lines = marked_lines(CONSUMERS_DOC, THIS_TEST)
    assert "pulumi up" in lines, lines
    for line in (line for line in lines if line.startswith("pulumi stack init")):
        result = consumer.workspace.shell(line)
        assert result.returncode == 0, f"documented command failed: {line}\n{output(result)}"
    consumer.workspace.ok("up", "--yes", "--skip-preview")
    return consumer


def test_up_creates_what_render_agent_renders(installed: Consumer) -> None:
    rendered = render_agent(installed.workspace)
    kinds = {o["kind"] for o in rendered}
    assert {"CustomResourceDefinition", "ServiceAccount", "Deployment", "PodDisruptionBudget"} <= kinds
    assert_live_equals_render(installed.api, rendered)
    installed.workspace.ok("preview", "--expect-no-changes")


def test_destroy_keeps_the_crd_the_claims_and_the_namespace(installed: Consumer) -> None:
    rendered = render_agent(installed.workspace)
    claim = {
        "apiVersion": API_VERSION,
        "kind": "DatabaseClaim",
        "metadata": {"name": "orders", "namespace": AGENT_NAMESPACE},
        "spec": {"sizeClass": "small"},
    }
    response = installed.api.create(claim)
    assert response.status == 201, f"{response.status} {response.message}"
    kept = versions(installed.api, [claim])

    installed.workspace.ok("destroy", "--yes", "--skip-preview")

    (crd,) = [o for o in rendered if o["kind"] == "CustomResourceDefinition"]
    assert live(installed.api, crd) is not None
    gone = versions(installed.api, [o for o in rendered if o is not crd])
    assert set(gone.values()) == {None}, [key for key, value in gone.items() if value]
    assert versions(installed.api, [claim]) == kept
    assert live(installed.api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}})
