"""`dbprovider lint` on a landscape repository in a temp dir: a clean merge request passes, each rule
that otherwise only shows at run time is reported with file, line, object and field, the GitHub format
annotates, and no token hash is ever quoted."""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.conftest import VALUES, read_docs, run, write_yaml
from tests.support.kubeapi import KubeApi
from tests.vectors.objects import NAMESPACE, consumer, shard

LINE_RE = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+): (?P<severity>error|warning): (?P<rest>.*) \[(?P<rule>[-a-z]+)\]$"
)


def findings(stdout: str) -> list[dict[str, str]]:
    parsed = []
    for line in stdout.splitlines():
        match = LINE_RE.match(line)
        assert match, f"not a finding line: {line!r}"
        parsed.append(match.groupdict())
    return parsed


@pytest.fixture(scope="session")
def made_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A landscape repo for one DB cluster: values, a Shard, and a consumer made by `consumer new`. Made once
    (a `consumer new` run per test was a third of this module's time); each test lints its own copy."""
    tmp = tmp_path_factory.mktemp("made")
    root = tmp / "landscape" / "db-eu-1"
    write_yaml(root / "dbprovider-values.yaml", VALUES)
    write_yaml(root / "shards" / "shard01.yaml", shard("shard01"))
    made = run(
        "consumer",
        "new",
        "team-a",
        "--max-databases",
        "10",
        "--namespace",
        NAMESPACE,
        "--out",
        str(root / "consumers"),
        "--token-file",
        "-",
        cwd=tmp,
    )
    assert made.returncode == 0, made.stderr
    (root / ".github").mkdir()
    (root / ".github" / "ci.yml").write_text("on: [push]\njobs: {}\n")  # not ours: skipped
    return root


@pytest.fixture
def repo(made_repo: Path, tmp_path: Path) -> Path:
    """This test's copy of the made repo, to edit freely: tmp_path/landscape/db-eu-1."""
    shutil.copytree(made_repo.parent, tmp_path / "landscape")
    return tmp_path / "landscape" / made_repo.name


def lint(repo: Path, *args: str) -> Any:
    """Lint as CI does: from the repository root, with a relative path (findings name files relative to it)."""
    root = repo.parent.parent
    return run("lint", *args, str(repo.relative_to(root)), cwd=root)


def in_repo(repo: Path, finding: dict[str, str]) -> str:
    return (repo.parent.parent / finding["file"]).relative_to(repo).as_posix()


def test_a_clean_repository_passes(repo: Path) -> None:
    result = lint(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
    assert "0 error(s), 0 warning(s)" in result.stderr


def _edit(path: Path, change: Any) -> None:
    docs = read_docs(path)
    change(docs[0])
    write_yaml(path, *docs)


def edit(relative: str, change: Any) -> Callable[[Path], None]:
    """A case's break: `change` applied to the first document of the repo's file `relative`."""
    return lambda repo: _edit(repo / relative, change)


def _second_consumer_with_the_same_secret(repo: Path) -> None:
    (secret,) = read_docs(repo / "consumers" / "team-a.token-secret.yaml")
    twin = copy.deepcopy(secret)
    twin["metadata"]["name"] = "team-b-token"
    write_yaml(repo / "consumers" / "team-b.yaml", consumer("team-b", tokenSecretRef__name="team-b-token"), twin)


CASES = [
    pytest.param(
        _second_consumer_with_the_same_secret,
        [
            ("consumers/team-a.consumer.yaml", "Consumer team-a spec.tokenSecretRef", "duplicate-token-hash"),
            ("consumers/team-b.yaml", "Consumer team-b spec.tokenSecretRef", "duplicate-token-hash"),
        ],
        id="same-hash-on-two-consumers",
    ),
    pytest.param(
        edit("consumers/team-a.consumer.yaml", lambda c: c["spec"].pop("maxDatabases")),
        [("consumers/team-a.consumer.yaml", "Consumer team-a spec", "consumer-quota")],
        id="consumer-without-quota",
    ),
    pytest.param(
        edit("consumers/team-a.consumer.yaml", lambda c: c["spec"]["tokenSecretRef"].update(namespace="elsewhere")),
        [
            (
                "consumers/team-a.consumer.yaml",
                "Consumer team-a spec.tokenSecretRef.namespace",
                "token-secret-namespace",
            ),
            ("consumers/team-a.consumer.yaml", "Consumer team-a spec.tokenSecretRef.name", "token-secret"),
        ],
        id="token-secret-outside-the-release-namespace",
    ),
    pytest.param(
        edit("shards/shard01.yaml", lambda s: s["spec"]["admin"]["secretRef"].update(name="not-listed")),
        [("shards/shard01.yaml", "Shard shard01 spec.admin.secretRef", "shard-secret")],
        id="admin-secret-not-in-shardSecrets",
    ),
    pytest.param(
        edit("shards/shard01.yaml", lambda s: s["spec"]["admin"].update(sslmode="prefer")),
        [("shards/shard01.yaml", "Shard shard01 spec.admin.sslmode", "shard-admin-tls")],
        id="admin-sslmode-that-may-go-without-tls",
    ),
    pytest.param(
        lambda repo: (
            _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"]["admin"].update(sslmode="disable")),
            _edit(repo / "dbprovider-values.yaml", lambda v: v.update(shardTLS={"cleartextShards": ["shard01"]})),
        ),
        [],
        id="admin-sslmode-disable-allowed-for-the-shard",
    ),
    pytest.param(
        edit(
            "dbprovider-values.yaml",
            lambda v: v["shardSecrets"][0].update(host="pg-shard02-primary.databases.svc", port=5432),
        ),
        [("shards/shard01.yaml", "Shard shard01 spec.admin", "shard-admin-endpoint")],
        id="admin-secret-bound-to-another-endpoint",
    ),
    pytest.param(
        lambda repo: write_yaml(repo / "shards" / "provisioner.yaml", _admin_secret()),
        [("dbprovider-values.yaml", "install values shardSecrets[0]", "shard-admin-unbound")],
        id="admin-secret-bound-to-no-endpoint",
    ),
    pytest.param(
        lambda repo: write_yaml(
            repo / "shards" / "provisioner.yaml", _admin_secret(host="pg-shard01-primary.databases.svc", port="5432")
        ),
        [],
        id="admin-secret-bound-by-its-own-keys",
    ),
    pytest.param(
        lambda repo: (
            write_yaml(repo / "shards" / "provisioner.yaml", _admin_secret()),
            _edit(
                repo / "dbprovider-values.yaml",
                lambda v: v["shardSecrets"][0].update(host="pg-shard01-primary.databases.svc", port=5432),
            ),
        ),
        [],
        id="admin-secret-bound-by-its-shardSecrets-entry",
    ),
    pytest.param(
        lambda repo: write_yaml(repo / "shards" / "copy.yaml", shard("shard01")),
        [("shards/shard01.yaml", "Shard shard01 metadata.name", "duplicate-name")],
        id="duplicate-shard-name",
    ),
    pytest.param(
        lambda repo: write_yaml(repo / "shards" / "cb.yaml", shard("cb", base=_cloudberry())),
        [("shards/cb.yaml", "Shard cb spec.engine", "engine-disabled")],
        id="cloudberry-shard-while-the-engine-is-off",
    ),
    pytest.param(
        edit("consumers/team-a.token-secret.yaml", lambda s: s["stringData"].update(sha256="not-a-hash\n")),
        [
            (
                "consumers/team-a.token-secret.yaml",
                "Secret clitest-system/team-a-token stringData.sha256",
                "token-secret",
            ),
            (
                "consumers/team-a.token-secret.yaml",
                "Secret clitest-system/team-a-token stringData.sha256",
                "token-secret",
            ),
        ],
        id="secret-without-a-hash",
    ),
    pytest.param(
        edit("shards/shard01.yaml", lambda s: s["spec"]["client"].update(host="10.0.0.010")),
        [("shards/shard01.yaml", "Shard shard01 spec.client.host", "schema")],
        id="client-host-with-a-leading-zero",
    ),
    pytest.param(
        edit("dbprovider-values.yaml", lambda v: v.update(softDelete={"retention": "1w"})),
        [("dbprovider-values.yaml", "install values softDelete.retention", "values")],
        id="invalid-install-value",
    ),
    pytest.param(
        edit("dbprovider-values.yaml", lambda v: v.update(replicaCount=3)),
        [("dbprovider-values.yaml", "install values replicaCount", "values")],
        id="unknown-install-key",
    ),
    pytest.param(  # a key another change added to domain/config.py: lint knows it through the parser
        edit("dbprovider-values.yaml", lambda v: v.update(api={"headerTimeout": "2h"})),
        [("dbprovider-values.yaml", "install values api.headerTimeout", "values")],
        id="api-timeout-out-of-range",
    ),
]


def _admin_secret(**keys: str) -> dict[str, Any]:
    """The Shard's admin Secret as a landscape repository may hold it (SOPS aside), with `keys` added."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pg-shard01-provisioner", "namespace": NAMESPACE},
        "stringData": {"user": "provisioner", "password": "not-a-real-password", **keys},
    }


def _cloudberry() -> dict[str, Any]:
    return {
        "engine": "cloudberry",
        "maxDatabases": 20,
        "keldonCluster": {"namespace": "analytics", "name": "c1"},
        "admin": {"secretRef": {"namespace": NAMESPACE, "name": "pg-shard01-provisioner"}},
        "client": {"host": "cb.example.com"},
    }


@pytest.mark.parametrize(("break_it", "expected"), CASES)
def test_each_rule_reports_file_object_and_field_and_fails_the_run(repo: Path, break_it: Any, expected: list) -> None:
    break_it(repo)
    result = lint(repo)
    got = [(in_repo(repo, f), f["rest"].split(": ")[0], f["rule"]) for f in findings(result.stdout)]
    assert sorted(got) == sorted(expected), result.stdout
    errors = [f for f in findings(result.stdout) if f["severity"] == "error"]
    assert result.returncode == (1 if errors else 0), result.stdout
    for finding in findings(result.stdout):  # the line points into the file
        assert not Path(finding["file"]).is_absolute()
        assert 1 <= int(finding["line"]) <= len((repo.parent.parent / finding["file"]).read_text().splitlines())


def test_line_numbers_point_at_the_field(repo: Path) -> None:
    path = repo / "shards" / "shard01.yaml"
    text = path.read_text().replace("192.0.2.200", "2001:db8::1")
    path.write_text(text)
    (finding,) = findings(lint(repo).stdout)
    line = text.splitlines()[int(finding["line"]) - 1]
    assert "host" in line and "2001:db8::1" in line


def test_a_typo_in_a_field_name_is_a_warning(repo: Path) -> None:
    _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"].update(maxDatabase=5))
    result = lint(repo)
    assert result.returncode == 0
    (finding,) = findings(result.stdout)
    assert (finding["severity"], finding["rule"]) == ("warning", "unknown-field")
    assert "spec.maxDatabase" in finding["rest"]


def test_github_format_annotates_the_merge_request(repo: Path) -> None:
    _second_consumer_with_the_same_secret(repo)
    result = lint(repo, "--format", "github")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(
            r"::error file=[^,]+\.yaml,line=\d+,title=dbprovider lint%3A duplicate-token-hash::.+", line
        )


def test_findings_never_quote_a_token_hash(repo: Path) -> None:
    _second_consumer_with_the_same_secret(repo)
    (secret,) = read_docs(repo / "consumers" / "team-a.token-secret.yaml")
    digest = secret["stringData"]["sha256"].strip()
    for fmt in ("text", "github"):
        result = lint(repo, "--format", fmt)
        assert digest not in result.stdout + result.stderr
        assert digest[:16] not in result.stdout + result.stderr


def test_without_values_the_namespace_rules_are_skipped_and_said_so(repo: Path) -> None:
    (repo / "dbprovider-values.yaml").unlink()
    result = lint(repo)
    assert result.returncode == 0
    (finding,) = findings(result.stdout)
    assert finding["rule"] == "no-values"


def test_values_given_with_a_flag_from_elsewhere(repo: Path, tmp_path: Path) -> None:
    values = repo / "dbprovider-values.yaml"
    moved = values.rename(tmp_path / "cluster.yaml")
    _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"]["admin"]["secretRef"].update(name="not-listed"))
    result = run("lint", "--values", str(moved), str(repo), cwd=tmp_path)
    assert result.returncode == 1
    assert [f["rule"] for f in findings(result.stdout)] == ["shard-secret"]


def test_yaml_syntax_errors_are_findings_with_a_line(repo: Path) -> None:
    (repo / "shards" / "broken.yaml").write_text("apiVersion: v1\nkind: [Secret\n")
    result = lint(repo)
    assert result.returncode == 1
    (finding,) = findings(result.stdout)
    assert finding["rule"] == "yaml" and finding["file"].endswith("broken.yaml")


@pytest.mark.parametrize(
    "args",
    [["nothere.yaml"], ["--values", "nothere.yaml", "."], ["--format", "junit", "."]],
    ids=["missing-path", "missing-values", "unknown-format"],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str]) -> None:
    assert run("lint", *args, cwd=tmp_path).returncode == 2


def test_with_kubeconfig_a_shard_below_what_is_placed_is_reported(
    repo: Path, crds: KubeApi, kube: Any, tmp_path: Path
) -> None:
    live = shard("clitest-lint-shard")
    crds.apply(live)
    try:
        status = {"status": {"databaseCount": 7, "observedGeneration": 1}}
        response = crds.merge_patch(live, status, subresource="status")
        assert response.status == 200, response.message
        write_yaml(repo / "shards" / "live.yaml", shard("clitest-lint-shard", maxDatabases=5))
        kubeconfig = tmp_path / "kubeconfig"
        kube.write_kubeconfig(kubeconfig)

        offline = lint(repo)
        assert offline.returncode == 0 and "shard-capacity" not in offline.stdout

        result = lint(repo, "--kubeconfig", str(kubeconfig))
        assert result.returncode == 1
        (finding,) = findings(result.stdout)
        assert finding["rule"] == "shard-capacity"
        assert "spec.maxDatabases" in finding["rest"] and "7" in finding["rest"]

        write_yaml(repo / "shards" / "live.yaml", shard("clitest-lint-shard", maxDatabases=7))
        assert lint(repo, "--kubeconfig", str(kubeconfig)).returncode == 0
    finally:
        crds.delete(live)


def test_an_unreachable_cluster_is_bad_input(repo: Path, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
                "users": [{"name": "x", "user": {"token": "t"}}],
            }
        )
    )
    result = lint(repo, "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2
    assert "--kubeconfig" in result.stderr


def test_v1beta1_objects_and_descriptions_are_checked_like_v1alpha1(repo: Path) -> None:
    """0.2.0 serves v1beta1 beside v1alpha1 with one schema, and adds the optional spec.description."""
    _edit(repo / "shards" / "shard01.yaml", lambda s: s.update(apiVersion="db.bnerd.com/v1beta1"))
    _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"].update(description="team payments, OPS-123"))
    assert lint(repo).returncode == 0
    _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"].update(description="x" * 257, maxDatabases=0))
    result = lint(repo)
    got = sorted((f["rule"], f["rest"].split(": ")[1]) for f in findings(result.stdout))
    assert [rule for rule, _ in got] == ["schema", "schema"], result.stdout
    _edit(repo / "shards" / "shard01.yaml", lambda s: s.update(apiVersion="db.bnerd.com/v1"))
    (finding,) = findings(lint(repo).stdout)
    assert "serves no db.bnerd.com/v1 Shard" in finding["rest"]


def test_a_memory_limit_below_the_sizing_for_the_fleet_is_a_warning(repo: Path) -> None:
    """The fleet from sizing.expectedDatabases, else the Shards' maxDatabases: the documented sizing (domain.sizing)
    must fit resources.manager.limits.memory, or the replicas are OOM-killed one after the other."""
    values = repo / "dbprovider-values.yaml"
    _edit(values, lambda v: v.update(sizing={"expectedDatabases": 100_000}))
    result = lint(repo)
    assert result.returncode == 0, result.stderr  # a warning: the install still works for a smaller fleet
    (finding,) = findings(result.stdout)
    assert (finding["severity"], finding["rule"]) == ("warning", "manager-memory")
    assert "resources.manager.limits.memory" in finding["rest"] and "100000 Databases" in finding["rest"]
    _edit(values, lambda v: v.update(resources={"manager": {"limits": {"memory": "8Gi"}}}))
    assert findings(lint(repo).stdout) == []
    _edit(values, lambda v: (v.pop("sizing"), v.pop("resources")))
    _edit(repo / "shards" / "shard01.yaml", lambda s: s["spec"].update(maxDatabases=100_000))
    (finding,) = findings(lint(repo).stdout)
    assert finding["rule"] == "manager-memory" and "the Shards' maxDatabases" in finding["rest"]
