"""The generated alert rules under promtool: syntax (`check rules`) and behaviour (`test rules`).

The promtool test files live in rules/tests/; the rule files they load are written here by
`dbprovider render --only prometheusrule --format rules`, so the tests run against what users ship.
The same rules in a real Prometheus scraping a real manager: tests/alerts/.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dbprovider.cli import main
from domain.config import DEFAULT_RUNBOOK_BASE_URL, load_install_config
from infra.render import render_prometheus_rule, rule_groups
from tests.support.documented import github_anchors

REPO_ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = REPO_ROOT / "rules" / "tests"
ALERTS = {
    # name: (severity, for)
    "DBProviderDown": ("critical", "10m"),
    "DBProviderShardNotReady": ("critical", "5m"),
    "DBProviderShardScalingTooLong": ("warning", None),
    "DBProviderDatabaseStuckProvisioning": ("warning", None),
    "DBProviderShardNearCapacity": ("warning", "10m"),
    "DBProviderReconcileErrors": ("warning", "15m"),
    "DBProviderDatabaseFailed": ("warning", "15m"),
    "DBProviderDeletionHeld": ("warning", "5m"),
    "DBProviderMoveStuck": ("warning", None),
    "DBProviderDrainMovesFailed": ("warning", "15m"),
}
# Only with prometheusRule.cluster: the series reach Prometheus without that label (see operations.md).
CLUSTER_ONLY_ALERTS = {"DBProviderClusterLabelMissing": ("critical", "10m")}
OPERATIONS_MD = REPO_ROOT / "docs" / "operations.md"
# Rule file name -> the install config it is rendered from (see rules/README.md).
RULE_FILES: dict[str, dict[str, Any]] = {
    "alerts-cluster.yaml": {"prometheusRule": {"enabled": True, "cluster": "eu-1"}},
    "alerts-unscoped.yaml": {
        "prometheusRule": {"enabled": True, "jobSelector": "db-provider"},
        "moves": {"stuckAfter": "2h"},
    },
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install the Debian package `prometheus` (hack/setup.sh does)")
    return path


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rules")
    for name, values in RULE_FILES.items():
        config_file = directory / f"{name}.values.yaml"
        config_file.write_text(yaml.safe_dump({"tls": {"secretName": "tls"}, **values}))
        code = main(
            [
                "render",
                "--config",
                str(config_file),
                "--only",
                "prometheusrule",
                "--format",
                "rules",
                "-o",
                str(directory / name),
            ]
        )
        assert code == 0
    for test_file in RULE_TESTS.glob("*.test.yaml"):
        shutil.copy(test_file, directory / test_file.name)
    return directory


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rule_file", sorted(RULE_FILES))
def test_promtool_check_rules_passes(rules_dir: Path, rule_file: str) -> None:
    result = _run("check", "rules", rule_file, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = len(ALERTS) + (len(CLUSTER_ONLY_ALERTS) if "cluster" in RULE_FILES[rule_file]["prometheusRule"] else 0)
    assert f"SUCCESS: {expected} rules found" in result.stdout


def test_the_default_format_is_the_prometheus_rule_which_promtool_refuses(rules_dir: Path) -> None:
    """The custom resource is for the Prometheus Operator; a plain Prometheus needs --format rules."""
    config_file = rules_dir / "alerts-cluster.yaml.values.yaml"
    output = str(rules_dir / "cr.yaml")
    assert main(["render", "--config", str(config_file), "--only", "prometheusrule", "-o", output]) == 0
    (rule,) = yaml.safe_load_all((rules_dir / "cr.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert _run("check", "rules", "cr.yaml", cwd=rules_dir).returncode != 0
    plain = yaml.safe_load((rules_dir / "alerts-cluster.yaml").read_text())
    assert plain == rule_groups(rule)


@pytest.mark.parametrize("test_file", sorted(p.name for p in RULE_TESTS.glob("*.test.yaml")))
def test_promtool_rule_tests_pass(rules_dir: Path, test_file: str) -> None:
    result = _run("test", "rules", test_file, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case_in_the_cluster_scoped_tests() -> None:
    suite = yaml.safe_load((RULE_TESTS / "alerts-cluster.test.yaml").read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in suite["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == set(ALERTS) | set(CLUSTER_ONLY_ALERTS)
    assert quiet == set(ALERTS) | set(CLUSTER_ONLY_ALERTS)


def test_the_eight_alerts_with_severities_and_durations() -> None:
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True}})
    (group,) = render_prometheus_rule(config)["spec"]["groups"]
    found = {rule["alert"]: (rule["labels"]["severity"], rule.get("for")) for rule in group["rules"]}
    assert found == ALERTS
    scoped = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True, "cluster": "c"}})
    (group,) = render_prometheus_rule(scoped)["spec"]["groups"]
    found = {rule["alert"]: (rule["labels"]["severity"], rule.get("for")) for rule in group["rules"]}
    assert found == ALERTS | CLUSTER_ONLY_ALERTS


def test_every_alert_links_a_runbook_section_that_exists_in_operations_md() -> None:
    anchors = github_anchors(OPERATIONS_MD.read_text())
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True, "cluster": "c"}})
    rules = render_prometheus_rule(config)["spec"]["groups"][0]["rules"]
    assert len(rules) == len(ALERTS) + len(CLUSTER_ONLY_ALERTS)
    for rule in rules:
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == DEFAULT_RUNBOOK_BASE_URL
        assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_runbook_base_url_labels_and_annotations_are_configurable() -> None:
    config = load_install_config(
        {
            "tls": {"secretName": "tls"},
            "namespace": "dbs",
            "prometheusRule": {
                "enabled": True,
                "runbookBaseUrl": "https://wiki.example.com/runbooks/dbprovider",
                "labels": {"release": "kube-prometheus-stack", "app.kubernetes.io/name": "mine"},
                "annotations": {"example.com/owner": "team-db"},
            },
        }
    )
    rule = render_prometheus_rule(config)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "dbprovider"  # ours are not overridden
    assert rule["metadata"]["annotations"] == {"example.com/owner": "team-db"}
    for alert in rule["spec"]["groups"][0]["rules"]:
        assert alert["annotations"]["runbook_url"].startswith("https://wiki.example.com/runbooks/dbprovider#")
        assert alert["labels"]["namespace"] == "dbs"


def test_the_test_time_scale_shortens_every_duration_and_nothing_else() -> None:
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True, "cluster": "c"}})
    normal = render_prometheus_rule(config)["spec"]["groups"][0]["rules"]
    fast = render_prometheus_rule(config, time_scale=60)["spec"]["groups"][0]["rules"]
    durations = {"10m": "10s", "5m": "5s", "15m": "15s"}
    for slow, quick in zip(normal, fast, strict=True):
        assert quick.get("for") == (durations[slow["for"]] if "for" in slow else None)
        assert quick["annotations"] == slow["annotations"]
    exprs = {r["alert"]: r["expr"] for r in fast}
    assert "[10s]" in exprs["DBProviderReconcileErrors"]
    assert "> 15" in exprs["DBProviderDatabaseStuckProvisioning"]


def test_thresholds_of_the_seed() -> None:
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True}})
    exprs = {r["alert"]: r["expr"] for r in render_prometheus_rule(config)["spec"]["groups"][0]["rules"]}
    assert "> 900" in exprs["DBProviderDatabaseStuckProvisioning"]  # 15 minutes
    assert ">= 0.9" in exprs["DBProviderShardNearCapacity"]
    assert "dbprovider_shard_max_databases" in exprs["DBProviderShardNearCapacity"]
    assert "> 0)" in exprs["DBProviderShardNearCapacity"]  # max 0 = no limit: disabled
    assert "dbprovider_shard_connection_budget" in exprs["DBProviderShardNearCapacity"]  # connections too
    assert 'phase="Failed"' in exprs["DBProviderDatabaseFailed"]
    assert "absent(up{" in exprs["DBProviderDown"]
    # Twice the backoff cap (300 s): one object failing on every retry keeps the expression true.
    assert "[10m]" in exprs["DBProviderReconcileErrors"]


def test_the_stuck_move_alert_follows_moves_stuck_after() -> None:
    """6h by default; `moves.stuckAfter` sets the threshold and the summary (and the time scale divides it)."""

    def stuck(values: dict[str, Any], time_scale: int = 1) -> dict[str, Any]:
        config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True}, **values})
        rules = render_prometheus_rule(config, time_scale=time_scale)["spec"]["groups"][0]["rules"]
        (rule,) = [r for r in rules if r["alert"] == "DBProviderMoveStuck"]
        return rule

    assert stuck({})["expr"].endswith("> 21600")
    assert stuck({})["annotations"]["summary"] == "A DatabaseMove has not finished within 6h."
    custom = stuck({"moves": {"stuckAfter": "90m"}})
    assert custom["expr"].endswith("> 5400")
    assert custom["annotations"]["summary"] == "A DatabaseMove has not finished within 1h30m."
    assert stuck({"moves": {"stuckAfter": "90m"}}, time_scale=60)["expr"].endswith("> 90")
