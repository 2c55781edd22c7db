"""`pulumi up / preview / destroy` of infra/ with the real CLI, language host and Kubernetes provider.

One stack, configured with the README's and docs/install.md's `pulumi` command lines verbatim, goes through a
platform engineer's whole life cycle on two real apiservers; the tests run in file order and each says
which state it leaves. Live objects are read from the apiservers and compared with `dbprovider render`
for the stack's own config, never with Pulumi's state.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.constants import API_VERSION
from harness.pulumi import REPO_ROOT, PulumiWorkspace, output
from infra.config import KEY_DASHBOARD_CONFIGMAP, PULUMI_ONLY_KEYS
from infra.render import object_key
from tests.pulumi.conftest import STACK, Clusters
from tests.pulumi.live import assert_live_equals_render, live, versions
from tests.support.kubeapi import KubeApi

# --- the documented commands --------------------------------------------------------------------------


def readme_commands() -> list[str]:
    """The `pulumi` lines of the README's Install section (an indented block)."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    pulumi ")]


def install_doc_commands() -> list[str]:
    """The lines of the first `sh` block of docs/install.md's Pulumi section."""
    text = (REPO_ROOT / "docs" / "install.md").read_text()
    section = text.split("## With Pulumi", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def install_doc_dashboard_commands() -> list[str]:
    """The `sh` block of docs/install.md's Pulumi section that asks for the dashboard's ConfigMap."""
    section = (REPO_ROOT / "docs" / "install.md").read_text().split("## With Pulumi", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```sh\n")[1:]]
    (block,) = [b for b in blocks if f"dbprovider:{KEY_DASHBOARD_CONFIGMAP}" in b]
    return [line.strip() for line in block.splitlines() if line.strip()]


def install_doc_stack_file() -> dict[str, Any]:
    """The `Pulumi.eu-1.yaml` docs/install.md says those commands leave."""
    section = (REPO_ROOT / "docs" / "install.md").read_text().split("## With Pulumi", 1)[1]
    return yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])


def configuring(commands: list[str]) -> list[str]:
    return [c for c in commands if c.startswith(("pulumi stack init", "pulumi config set"))]


# --- the stack's config and its render -------------------------------------------------------------------


def install_values(workspace: PulumiWorkspace) -> dict[str, Any]:
    """The stack's `dbprovider:` config as the install config file `dbprovider render --config` reads."""
    entries = json.loads(workspace.ok("config", "--json", "--show-secrets"))
    values: dict[str, Any] = {}
    for full_key, entry in entries.items():
        namespace, _, key = full_key.partition(":")
        if namespace != "dbprovider" or key in PULUMI_ONLY_KEYS:
            continue
        values[key] = entry["objectValue"] if "objectValue" in entry else entry["value"]
    return values


def render_text(workspace: PulumiWorkspace, tmp_path: Path, *args: str) -> str:
    """What `dbprovider render` (the console script) writes for the stack's config."""
    config = tmp_path / "values.yaml"
    config.write_text(yaml.safe_dump(install_values(workspace)))
    command = [str(Path(sys.executable).parent / "dbprovider"), "render", "--config", str(config), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout


def render(workspace: PulumiWorkspace, tmp_path: Path, *only: str) -> list[dict[str, Any]]:
    """`dbprovider render [--only ...]` of the stack's config, parsed."""
    text = render_text(workspace, tmp_path, *(["--only", *only] if only else []))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_dashboard_configmap(workspace: PulumiWorkspace, tmp_path: Path) -> dict[str, Any]:
    """`dbprovider render --only dashboard --format configmap`: the object dashboardConfigMap asks Pulumi for."""
    (configmap,) = render(workspace, tmp_path, "dashboard", "--format", "configmap")
    return configmap


def render_db_cluster(workspace: PulumiWorkspace, tmp_path: Path) -> list[dict[str, Any]]:
    """Every object the installed stack (with dbprovider:dashboardConfigMap) owns in the DB cluster."""
    return render(workspace, tmp_path) + [render_dashboard_configmap(workspace, tmp_path)]


def items(api: KubeApi, api_version: str, kind: str) -> list[dict[str, Any]]:
    return api.ok("GET", api.path(api_version, kind))["items"]


# --- the life cycle -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def configured(workspace: PulumiWorkspace) -> PulumiWorkspace:
    """`pulumi stack init` and every `pulumi config set` of the README and docs/install.md, verbatim."""
    readme = configuring(readme_commands())
    assert readme, "the README's Install section shows no pulumi commands"
    for command in readme + [c for c in configuring(install_doc_commands()) if c not in readme]:
        result = workspace.shell(command)
        assert result.returncode == 0, f"documented command failed: {command}\n{output(result)}"
    return workspace


def test_the_documented_commands_leave_the_documented_stack_file(configured: PulumiWorkspace) -> None:
    stack_file = yaml.safe_load((configured.project_dir / f"Pulumi.{STACK}.yaml").read_text())
    documented = install_doc_stack_file()
    # An encrypted value differs per stack; that it is encrypted (`secure: ...`) is what the docs show.
    key = "dbprovider:prometheusKubeconfig"
    for document in (stack_file, documented):
        document["config"][key] = list(document["config"][key])
    assert stack_file["config"] == documented["config"]


def test_without_its_namespaces_the_install_fails_early_naming_them(
    configured: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    rendered = render(configured, tmp_path)
    namespaces = sorted({o["metadata"]["namespace"] for o in rendered if "namespace" in o["metadata"]})
    assert namespaces == ["databases", "pg-shard01"]
    for name in namespaces:
        assert live(clusters.db_api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}) is None
    for command in (("preview",), ("up", "--yes")):
        result = configured.pulumi(*command)
        assert result.returncode != 0
        # The engine stops at the first failed step, so at least one of them is named (maybe the rule's
        # namespace in the central cluster, also missing here).
        pattern = r"Namespace \((?:prometheus:)?must-exist/([a-z0-9-]+)\).*\n.*resource '\1' does not exist"
        missing = re.findall(pattern, output(result))
        assert missing and set(missing) <= set(namespaces), output(result)
    assert set(versions(clusters.db_api, rendered).values()) == {None}, "a failed up created objects"


@pytest.fixture(scope="module")
def installed(configured: PulumiWorkspace, clusters: Clusters) -> PulumiWorkspace:
    """The namespaces the docs ask for, the documented dashboardConfigMap line, then `pulumi up --yes`."""
    for name in ("databases", "pg-shard01"):
        clusters.db.ensure_namespace(name)
    clusters.prometheus.ensure_namespace("databases")  # the rule's namespace there: prometheusNamespace unset
    for command in install_doc_dashboard_commands():
        result = configured.shell(command)
        assert result.returncode == 0, f"documented command failed: {command}\n{output(result)}"
    configured.ok("up", "--yes", "--skip-preview")
    return configured


def test_up_creates_every_rendered_object_as_rendered(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    rendered = render_db_cluster(installed, tmp_path)
    kinds = {o["kind"] for o in rendered}
    assert {"CustomResourceDefinition", "Deployment", "ServiceMonitor", "ValidatingAdmissionPolicy"} <= kinds
    assert_live_equals_render(clusters.db_api, rendered)


def test_the_dashboard_is_live_for_the_grafana_sidecar_and_a_stack_output(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    """The ConfigMap equals `render --only dashboard --format configmap`, the output `render --only dashboard`."""
    configmap = render_dashboard_configmap(installed, tmp_path)
    found = live(clusters.db_api, configmap)
    assert found is not None, "no dashboard ConfigMap in the DB cluster"
    assert found["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert found["data"] == configmap["data"]
    name = configmap["metadata"]["name"]
    assert [c for c in items(clusters.prometheus_api, "v1", "ConfigMap") if c["metadata"]["name"] == name] == []
    dashboard = render_text(installed, tmp_path, "--only", "dashboard")
    assert json.loads(installed.ok("stack", "output", "dashboardJson", "--json")) == dashboard
    assert json.loads(dashboard)["uid"] == "dbprovider"


def test_the_prometheus_rule_lands_in_the_central_cluster_only(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    (rule,) = render(installed, tmp_path, "prometheusrule")
    assert_live_equals_render(clusters.prometheus_api, [rule])
    assert items(clusters.db_api, "monitoring.coreos.com/v1", "PrometheusRule") == []
    # and the ServiceMonitor, applied against the real CRD in the DB cluster, is not in the central one
    assert items(clusters.prometheus_api, "monitoring.coreos.com/v1", "ServiceMonitor") == []
    (monitor,) = items(clusters.db_api, "monitoring.coreos.com/v1", "ServiceMonitor")
    assert monitor["metadata"]["name"] == "dbprovider"


@pytest.mark.parametrize("flags", [(), ("--refresh",)], ids=["preview", "preview-refresh"])
def test_preview_right_after_up_expects_no_changes(installed: PulumiWorkspace, flags: tuple[str, ...]) -> None:
    installed.ok("preview", "--expect-no-changes", *flags)


def test_a_config_change_updates_exactly_the_changed_objects_in_place(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    before = render_db_cluster(installed, tmp_path)
    clusters.db.ensure_namespace("pg-shard02")
    for command in (
        "pulumi config set --path 'dbprovider:sizeClasses.small.connectionLimit' 7",
        "pulumi config set --path --plaintext 'dbprovider:shardSecrets[1].namespace' pg-shard02",
        "pulumi config set --path --plaintext 'dbprovider:shardSecrets[1].name' pg-shard02-pguser-provisioner",
    ):
        assert installed.shell(command).returncode == 0, command
    after = render_db_cluster(installed, tmp_path)
    old = {object_key(o): o for o in before}
    changed = {object_key(o) for o in after if object_key(o) in old and old[object_key(o)] != o}
    added = {object_key(o) for o in after if object_key(o) not in old}
    assert ("v1", "ConfigMap", "databases", "dbprovider-config") in changed
    assert ("apps/v1", "Deployment", "databases", "dbprovider") in changed
    assert ("v1", "ConfigMap", "databases", "dbprovider-dashboard") in old.keys() - changed  # not rewritten
    assert {(k[1], k[2]) for k in added} == {("Role", "pg-shard02"), ("RoleBinding", "pg-shard02")}
    assert {object_key(o) for o in after} >= set(old), "the change removes no object"

    previous = versions(clusters.db_api, after)
    installed.ok("up", "--yes", "--skip-preview")
    current = versions(clusters.db_api, after)
    for key in old:
        uid, version = previous[key] or ("", "")
        assert current[key] is not None and current[key][0] == uid, f"{key} was replaced or deleted"
        assert (current[key][1] != version) == (key in changed), f"{key}: written {current[key][1] != version}"
    assert all(previous[key] is None and current[key] is not None for key in added)
    assert_live_equals_render(clusters.db_api, after)


# (command, what the failure must say): the `dbprovider:` key and the problem.
BAD_CONFIG = [
    pytest.param("pulumi config set dbprovider:colour blue", "dbprovider:colour: is not a known key", id="unknown-key"),
    pytest.param(
        """pulumi config set --path dbprovider:prometheusRule.jobSelector 'db"provider'""",
        r"dbprovider:prometheusRule\.jobSelector: must not contain",
        id="invalid-job-selector",
    ),
    # Pulumi may drop the emptied `tls` object with its last key; then the install config misses `tls`.
    pytest.param(
        "pulumi config rm --path dbprovider:tls.secretName", r"dbprovider:tls(\.secretName)?: is required", id="no-tls"
    ),
]


@pytest.mark.parametrize(("command", "message"), BAD_CONFIG)
def test_a_bad_config_fails_naming_the_key_and_changes_nothing(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path, command: str, message: str
) -> None:
    rendered = render_db_cluster(installed, tmp_path)
    (rule,) = render(installed, tmp_path, "prometheusrule")
    before = versions(clusters.db_api, rendered), versions(clusters.prometheus_api, [rule])
    stack_file = installed.project_dir / f"Pulumi.{STACK}.yaml"
    good = stack_file.read_text()
    assert installed.shell(command).returncode == 0, command
    try:
        for operation in (("preview",), ("up", "--yes")):
            result = installed.pulumi(*operation)
            assert result.returncode != 0, output(result)
            assert re.search(message, output(result)), output(result)
    finally:
        stack_file.write_text(good)
    assert (versions(clusters.db_api, rendered), versions(clusters.prometheus_api, [rule])) == before


def test_destroy_keeps_the_crds_and_every_shard_consumer_and_database(
    installed: PulumiWorkspace, clusters: Clusters, tmp_path: Path
) -> None:
    rendered = render_db_cluster(installed, tmp_path)
    assert rendered[-1]["metadata"]["name"] == "dbprovider-dashboard"
    (rule,) = render(installed, tmp_path, "prometheusrule")
    held = [
        {
            "apiVersion": API_VERSION,
            "kind": "Shard",
            "metadata": {"name": "pg-shard01"},
            "spec": {
                "maxDatabases": 200,
                "perconaCluster": {"namespace": "pg-shard01", "name": "pg-shard01"},
                "admin": {
                    "serviceName": "pg-shard01-primary",
                    "secretRef": {"namespace": "pg-shard01", "name": "pg-shard01-pguser-provisioner"},
                },
                "client": {"host": "192.0.2.200"},
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "Consumer",
            "metadata": {"name": "team-a"},
            "spec": {"tokenSecretRef": {"namespace": "databases", "name": "team-a-token"}, "maxDatabases": 50},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "Database",
            "metadata": {"name": "team-a-orders", "namespace": "databases"},
            "spec": {"consumer": "team-a", "externalId": "orders"},
        },
    ]
    for obj in held:
        response = clusters.db_api.create(obj)
        assert response.status == 201, f"{obj['kind']}: {response.status} {response.message}"
    kept = versions(clusters.db_api, held)

    installed.ok("destroy", "--yes", "--skip-preview")

    crds = [o for o in rendered if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 4 and None not in versions(clusters.db_api, crds).values()
    gone = versions(clusters.db_api, [o for o in rendered if o not in crds])
    assert set(gone.values()) == {None}, [key for key, value in gone.items() if value]
    assert versions(clusters.prometheus_api, [rule]) == {object_key(rule): None}
    assert versions(clusters.db_api, held) == kept
    for name in ("databases", "pg-shard01"):  # never the installer's to delete
        assert live(clusters.db_api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
