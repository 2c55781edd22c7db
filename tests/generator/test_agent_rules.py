"""The agent's alert rules (`dbprovider render --agent --only prometheusrule`) under promtool: syntax and
the behaviour cases of rules/tests/agent/, run against the rule file the command writes. The same rules
in a real Prometheus scraping a real agent: tests/alerts/test_agent_alerts.py."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import yaml

from dbprovider.cli import main
from dbprovider.render import EXIT_INVALID, run_render_agent
from domain.agent_config import AGENT_RUNBOOK_BASE_URL, load_agent_config
from infra.render import render_agent_manifests, render_agent_prometheus_rule
from tests.generator.test_prometheus_rules import _run
from tests.support.documented import github_anchors

REPO_ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = REPO_ROOT / "rules" / "tests" / "agent"
CONSUMERS_MD = REPO_ROOT / "docs" / "consumers.md"
VALUES = {"providerUrl": "https://p.example:8443", "tokenSecret": "tok", "prometheusRule": {"enabled": True}}
ALERTS = {
    # name: (severity, for)
    "DBProviderAgentDown": ("critical", "5m"),
    "DBProviderAgentNoLeader": ("critical", "5m"),
    "DBProviderAgentProviderUnreachable": ("warning", "2m"),
    "DBProviderAgentClaimsNotReady": ("warning", None),
    "DBProviderAgentSecretWritesFailing": ("warning", "10m"),
}


def rules(values: dict[str, object] | None = None, time_scale: int = 1) -> list[dict[str, object]]:
    config = load_agent_config(values or VALUES)
    (group,) = render_agent_prometheus_rule(config, time_scale)["spec"]["groups"]
    return list(group["rules"])


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("agent-rules")
    values = directory / "agent.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    argv = ["render", "--agent", "--config", str(values), "--only", "prometheusrule", "--format", "rules"]
    assert main([*argv, "-o", str(directory / "agent-alerts.yaml")]) == 0
    for test_file in RULE_TESTS.glob("*.test.yaml"):
        shutil.copy(test_file, directory / test_file.name)
    return directory


def test_promtool_checks_the_rendered_rules(rules_dir: Path) -> None:
    result = _run("check", "rules", "agent-alerts.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_rule_tests_pass(rules_dir: Path) -> None:
    result = _run("test", "rules", "alerts.test.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    suite = yaml.safe_load((RULE_TESTS / "alerts.test.yaml").read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in suite["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == quiet == set(ALERTS)


def test_the_alerts_with_severities_durations_and_runbooks_in_consumers_md() -> None:
    found = rules()
    assert {r["alert"]: (r["labels"]["severity"], r.get("for")) for r in found} == ALERTS
    anchors = github_anchors(CONSUMERS_MD.read_text())
    for rule in found:
        base, _, anchor = str(rule["annotations"]["runbook_url"]).partition("#")  # type: ignore[index]
        assert base == AGENT_RUNBOOK_BASE_URL
        assert anchor == str(rule["alert"]).lower() and anchor in anchors, rule["alert"]


def test_thresholds_and_the_job_are_configurable_and_the_time_scale_shortens_them() -> None:
    exprs = {r["alert"]: r["expr"] for r in rules()}
    assert "> 600" in exprs["DBProviderAgentProviderUnreachable"]
    assert "> 900" in exprs["DBProviderAgentClaimsNotReady"]
    assert 'job="dbprovider-agent-metrics"' in exprs["DBProviderAgentDown"]
    values = {
        **VALUES,
        "prometheusRule": {
            "enabled": True,
            "jobSelector": "agents",
            "providerUnreachableAfter": "30m",
            "claimNotReadyAfter": "1h",
            "runbookBaseUrl": "https://wiki.example.com/agent",
        },
    }
    custom = {r["alert"]: r for r in rules(values)}
    assert "> 1800" in custom["DBProviderAgentProviderUnreachable"]["expr"]  # type: ignore[operator]
    assert "> 3600" in custom["DBProviderAgentClaimsNotReady"]["expr"]  # type: ignore[operator]
    assert all('job="agents"' in r["expr"] and "dbprovider-agent-metrics" not in r["expr"] for r in custom.values())  # type: ignore[operator]
    assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example.com/agent#") for r in custom.values())  # type: ignore[index]
    fast = {r["alert"]: r for r in rules(time_scale=60)}
    assert fast["DBProviderAgentDown"]["for"] == "5s"
    assert "> 10" in fast["DBProviderAgentProviderUnreachable"]["expr"]  # type: ignore[operator]
    assert "[5s]" in fast["DBProviderAgentSecretWritesFailing"]["expr"]  # type: ignore[operator]


def test_the_rule_file_is_rendered_whether_or_not_the_rule_is_among_the_objects(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"providerUrl": "https://p.example:8443", "tokenSecret": "tok"}))
    out = tmp_path / "rules.yaml"
    assert run_render_agent(str(config), str(out), only="prometheusrule", fmt="rules") == 0
    assert yaml.safe_load(out.read_text())["groups"][0]["name"] == "dbprovider-agent"


def test_enabled_the_rule_is_among_the_agents_objects_for_the_prometheus_operator() -> None:
    without = render_agent_manifests(load_agent_config({k: v for k, v in VALUES.items() if k != "prometheusRule"}))
    assert "PrometheusRule" not in {o["kind"] for o in without}
    (rule,) = [o for o in render_agent_manifests(load_agent_config(VALUES)) if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "dbprovider-agent"
    assert rule == render_agent_prometheus_rule(load_agent_config(VALUES))


@pytest.mark.parametrize(
    ("values", "only", "message"),
    [
        (VALUES, "dashboard", "no dashboard"),
        (
            {**VALUES, "prometheusRule": {"enabled": True, "claimNotReadyAfter": "10s"}},
            "manifests",
            "claimNotReadyAfter",
        ),
    ],
)
def test_refused_renders_say_why(tmp_path: Path, values: dict[str, object], only: str, message: str) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(values))
    err = io.StringIO()
    assert run_render_agent(str(config), str(tmp_path / "out.yaml"), stderr=err, only=only) == EXIT_INVALID
    assert message in err.getvalue()
