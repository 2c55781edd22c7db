"""The generated alert rules under promtool: syntax (`check rules`) and behaviour (`test rules`).

The promtool test files live in rules/tests/; the rule files they load are rendered here from the
templates, so the tests always run against what `dbprovider render --only prometheusrule` ships.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config import load_install_config
from infra.render import render_prometheus_rule, rule_groups

REPO_ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = REPO_ROOT / "rules" / "tests"
ALERTS = {
    # name: (severity, for)
    "DBProviderDown": ("critical", "10m"),
    "DBProviderShardNotReady": ("critical", "5m"),
    "DBProviderDatabaseStuckProvisioning": ("warning", None),
    "DBProviderShardNearCapacity": ("warning", "10m"),
    "DBProviderReconcileErrors": ("warning", "15m"),
    "DBProviderDatabaseFailed": ("warning", "15m"),
    "DBProviderDeletionHeld": ("warning", "5m"),
}
# Rule file name -> the install config it is rendered from (see rules/README.md).
RULE_FILES: dict[str, dict[str, Any]] = {
    "alerts-cluster.yaml": {"prometheusRule": {"enabled": True, "cluster": "eu-1"}},
    "alerts-unscoped.yaml": {"prometheusRule": {"enabled": True, "jobSelector": "db-provider"}},
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
        config = load_install_config({"tls": {"secretName": "tls"}, **values})
        (directory / name).write_text(yaml.safe_dump(rule_groups(render_prometheus_rule(config)), sort_keys=False))
    for test_file in RULE_TESTS.glob("*.test.yaml"):
        shutil.copy(test_file, directory / test_file.name)
    return directory


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rule_file", sorted(RULE_FILES))
def test_promtool_check_rules_passes(rules_dir: Path, rule_file: str) -> None:
    result = _run("check", "rules", rule_file, cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


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
    assert firing == set(ALERTS)
    assert quiet == set(ALERTS)


def test_the_seven_alerts_with_severities_and_durations() -> None:
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True}})
    (group,) = render_prometheus_rule(config)["spec"]["groups"]
    found = {rule["alert"]: (rule["labels"]["severity"], rule.get("for")) for rule in group["rules"]}
    assert found == ALERTS


def test_thresholds_of_the_seed() -> None:
    config = load_install_config({"tls": {"secretName": "tls"}, "prometheusRule": {"enabled": True}})
    exprs = {r["alert"]: r["expr"] for r in render_prometheus_rule(config)["spec"]["groups"][0]["rules"]}
    assert "> 900" in exprs["DBProviderDatabaseStuckProvisioning"]  # 15 minutes
    assert ">= 0.9 *" in exprs["DBProviderShardNearCapacity"]
    assert "dbprovider_shard_max_databases" in exprs["DBProviderShardNearCapacity"]
    assert "> 0)" in exprs["DBProviderShardNearCapacity"]  # max 0 = no limit: disabled
    assert 'phase="Failed"' in exprs["DBProviderDatabaseFailed"]
    assert "absent(up{" in exprs["DBProviderDown"]
