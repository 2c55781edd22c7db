"""`dbprovider render`: the install's manifests as multi-document YAML, for a GitOps landscape repo.

    dbprovider render --config values.yaml                          # the DB cluster's objects
    dbprovider render --config values.yaml --only prometheusrule    # the rule, for the central Prometheus

The objects are exactly those `pulumi up` creates (both come from infra.render). An invalid config exits
with status 2 and names the offending key; warnings go to stderr so the YAML on stdout stays clean.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from dbprovider.clitools import write_atomically
from domain.config import ConfigError, load_install_config_file

ONLY_MANIFESTS = "manifests"
ONLY_PROMETHEUS_RULE = "prometheusrule"
ONLY_CHOICES = (ONLY_MANIFESTS, ONLY_PROMETHEUS_RULE)

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_ERROR = 1


def run_render(config_path: str, only: str = ONLY_MANIFESTS, output: str = "-", stderr: TextIO | None = None) -> int:
    """Render and write; returns the process exit status."""
    from infra import render

    err = stderr or sys.stderr
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
    try:
        if only == ONLY_PROMETHEUS_RULE:
            objects = [render.render_prometheus_rule(config)]
            warnings = render.prometheus_rule_warnings(config)
        else:
            objects = render.render_manifests(config)
            warnings = render.install_warnings(config) + render.prometheus_rule_warnings(config)
    except render.TemplatesNotFound as exc:
        print(f"dbprovider render: {exc}", file=err)
        return EXIT_ERROR
    for warning in warnings:
        print(f"dbprovider render: warning: {warning}", file=err)
    text = render.dump_yaml(objects)
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomically(Path(output), text)
    return EXIT_OK

