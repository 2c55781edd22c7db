"""`dbprovider render`: the install's manifests as multi-document YAML, for a GitOps landscape repo.

    dbprovider render --config values.yaml                          # the DB cluster's objects
    dbprovider render --config values.yaml --only prometheusrule    # the rule, for the central Prometheus
    dbprovider render --config values.yaml --only prometheusrule --format rules   # a plain rule file
    dbprovider render --config values.yaml --only dashboard [--format configmap]  # the Grafana dashboard
    dbprovider render --agent --config agent.yaml                   # the consumer agent (consumer cluster)
    dbprovider render --agent --config agent.yaml --only prometheusrule [--format rules]   # its alert rules

The objects are exactly those `pulumi up` creates (both come from infra.render). An invalid config exits
with status 2 and names the offending key; warnings go to stderr so the YAML on stdout stays clean.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from dbprovider.clitools import write_atomically
from domain.config import ConfigError, InstallConfig, load_install_config_file

ONLY_MANIFESTS = "manifests"
ONLY_PROMETHEUS_RULE = "prometheusrule"
ONLY_DASHBOARD = "dashboard"
ONLY_CHOICES = (ONLY_MANIFESTS, ONLY_PROMETHEUS_RULE, ONLY_DASHBOARD)
FORMAT_PROMETHEUS_RULE = "prometheusrule"
FORMAT_RULES = "rules"
FORMAT_JSON = "json"
FORMAT_CONFIGMAP = "configmap"
# The formats each --only accepts; the first is the default.
FORMATS = {
    ONLY_MANIFESTS: ("yaml",),
    ONLY_PROMETHEUS_RULE: (FORMAT_PROMETHEUS_RULE, FORMAT_RULES),
    ONLY_DASHBOARD: (FORMAT_JSON, FORMAT_CONFIGMAP),
}

EXIT_OK = 0
EXIT_INVALID = 2


def run_render(
    config_path: str,
    only: str = ONLY_MANIFESTS,
    output: str = "-",
    stderr: TextIO | None = None,
    fmt: str | None = None,
    time_scale: int = 1,
) -> int:
    """Render and write; returns the process exit status."""
    from infra import render

    err = stderr or sys.stderr
    fmt = _format(only, fmt, time_scale, err)
    if fmt is None:
        return EXIT_INVALID
    try:
        config = load_install_config_file(config_path)
    except ConfigError as exc:
        print(f"dbprovider render: {exc}", file=err)
        return EXIT_INVALID
    if only == ONLY_PROMETHEUS_RULE and not config.prometheus_rule.enabled:
        print(
            "dbprovider render: invalid install config: prometheusRule.enabled: is false; set it to true "
            "to render the PrometheusRule",
            file=err,
        )
        return EXIT_INVALID
    if only == ONLY_DASHBOARD:
        text = _dashboard(config, fmt)
        warnings: list[str] = []
    elif only == ONLY_PROMETHEUS_RULE:
        rule = render.render_prometheus_rule(config, time_scale)
        text = render.dump_yaml([render.rule_groups(rule) if fmt == FORMAT_RULES else rule])
        warnings = render.prometheus_rule_warnings(config)
    else:
        text = render.dump_yaml(render.render_manifests(config))
        warnings = render.install_warnings(config) + render.prometheus_rule_warnings(config)
    for warning in warnings:
        print(f"dbprovider render: warning: {warning}", file=err)
    _write(text, output)
    return EXIT_OK


def _format(only: str, fmt: str | None, time_scale: int, err: TextIO) -> str | None:
    """The output format (--format, else the default of --only); None, with the reason on `err`, if the
    options do not go together."""
    fmt = fmt or FORMATS[only][0]
    if fmt not in FORMATS[only]:
        print(f"dbprovider render: --format {fmt} does not apply to --only {only}", file=err)
        return None
    if time_scale < 1:
        print("dbprovider render: --test-time-scale must be at least 1", file=err)
        return None
    return fmt


def _write(text: str, output: str) -> None:
    """To stdout for "-", else atomically to the file."""
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomically(Path(output), text)


def _dashboard(config: InstallConfig, fmt: str) -> str:
    from infra import dashboard, render

    if fmt == FORMAT_CONFIGMAP:
        return render.dump_yaml([dashboard.dashboard_configmap(config)])
    return dashboard.dashboard_json(config)


def run_render_agent(
    config_path: str,
    output: str = "-",
    stderr: TextIO | None = None,
    only: str = ONLY_MANIFESTS,
    fmt: str | None = None,
    time_scale: int = 1,
) -> int:
    """`dbprovider render --agent`: the consumer agent's objects from its values file, or (--only
    prometheusrule) its alert rules for the consumer cluster's Prometheus."""
    from domain.agent_config import load_agent_config
    from domain.config import read_install_values
    from infra import render

    err = stderr or sys.stderr
    if only == ONLY_DASHBOARD:
        print("dbprovider render: --agent renders no dashboard", file=err)
        return EXIT_INVALID
    fmt = _format(only, fmt, time_scale, err)
    if fmt is None:
        return EXIT_INVALID
    try:
        config = load_agent_config(read_install_values(config_path))
    except ConfigError as exc:
        print(f"dbprovider render: {exc}".replace("install config", "agent values"), file=err)
        return EXIT_INVALID
    if only == ONLY_PROMETHEUS_RULE:  # asked for by name: whether or not it is among the objects (enabled)
        rule = render.render_agent_prometheus_rule(config, time_scale)
        _write(render.dump_yaml([render.rule_groups(rule) if fmt == FORMAT_RULES else rule]), output)
        return EXIT_OK
    _write(render.dump_yaml(render.render_agent_manifests(config)), output)
    return EXIT_OK
