"""The Grafana dashboard of the provider, built with grafana-foundation-sdk (not hand-written JSON).

It is rendered beside the alert rules (`dbprovider render --only dashboard`), as JSON or as a ConfigMap
labelled `grafana_dashboard: "1"` for the Grafana sidecar. Every query selects the provider's job (the
rules' `prometheusRule.jobSelector`) and the dashboard's `cluster` and `shard` variables, and aggregates
the replicas away like the rules do (every replica exports the same fleet gauges).

    dashboard_panels(config)    -> (title, [PromQL]) of every panel, for tests that run them
    dashboard_json(config)      -> the dashboard as JSON text
    dashboard_configmap(config) -> the ConfigMap for the Grafana sidecar
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

from domain.config import InstallConfig
from infra.render import common_labels, job_matcher

DASHBOARD_UID = "dbprovider"
DASHBOARD_KEY = "dbprovider.json"
SIDECAR_LABEL = "grafana_dashboard"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# (title, unit, [(PromQL with {sel} and {shard}, legend)]) in dashboard order.
_Panel = tuple[str, str, list[tuple[str, str]]]
PANELS: tuple[_Panel, ...] = (
    ("Replicas up", "short", [("sum by (cluster) (up{{{sel}}})", "{{{{cluster}}}}")]),
    (
        "Databases per shard / maxDatabases",
        "short",
        [
            ("max by (cluster, shard) (dbprovider_shard_databases{{{sel}, {shard}}})", "{{{{shard}}}} in use"),
            ("max by (cluster, shard) (dbprovider_shard_max_databases{{{sel}, {shard}}})", "{{{{shard}}}} max"),
        ],
    ),
    (
        "Shard capacity used",
        "percentunit",
        [
            (
                "max by (cluster, shard) (dbprovider_shard_databases{{{sel}, {shard}}})"
                " / max by (cluster, shard) (dbprovider_shard_max_databases{{{sel}, {shard}}} > 0)",
                "{{{{shard}}}}",
            )
        ],
    ),
    (
        "Shard Ready (by reason)",
        "short",
        [
            (
                "min by (cluster, shard, reason) (dbprovider_shard_ready{{{sel}, {shard}}})",
                "{{{{shard}}}} {{{{reason}}}}",
            )
        ],
    ),
    (
        "Databases by phase",
        "short",
        [
            (
                "sum by (cluster, phase) (max by (cluster, shard, phase, reason) "
                "(dbprovider_databases{{{sel}, {shard}}}))",
                "{{{{phase}}}}",
            )
        ],
    ),
    (
        "Databases not Ready, by phase and reason",
        "short",
        [
            (
                "sum by (cluster, phase, reason) (max by (cluster, shard, phase, reason) "
                '(dbprovider_databases{{{sel}, {shard}, phase!="Ready"}}))',
                "{{{{phase}}}} {{{{reason}}}}",
            )
        ],
    ),
    (
        "Oldest Provisioning database",
        "s",
        [
            (
                "max by (cluster, shard) (dbprovider_database_provisioning_oldest_seconds{{{sel}, {shard}}})",
                "{{{{shard}}}}",
            )
        ],
    ),
    (
        "Database workers per shard: busy and waiting",
        "short",
        [
            # Only the leader has a work queue (the others report 0): sum, not max, over the replicas.
            (
                "sum by (cluster, shard) (dbprovider_database_workers_in_flight{{{sel}, {shard}}})",
                "{{{{shard}}}} busy",
            ),
            ("sum by (cluster, shard) (dbprovider_database_queue_depth{{{sel}, {shard}}})", "{{{{shard}}}} waiting"),
        ],
    ),
    (
        "Held deletions and connection limit drift",
        "short",
        [
            ("max by (cluster, shard) (dbprovider_databases_deletion_held{{{sel}, {shard}}})", "{{{{shard}}}} held"),
            (
                "max by (cluster, shard) (dbprovider_databases_connection_limit_drift{{{sel}, {shard}}})",
                "{{{{shard}}}} drift",
            ),
        ],
    ),
    (
        "DatabaseMoves by phase",
        "short",
        [("max by (cluster, phase) (dbprovider_moves{{{sel}}})", "{{{{phase}}}}")],
    ),
    (
        "DatabaseMoves finished in the last hour, by outcome",
        "short",
        [
            # Counted by the leader (the others export 0): sum over the replicas.
            (
                "sum by (cluster, outcome) (increase(dbprovider_moves_finished_total{{{sel}}}[1h]))",
                "{{{{outcome}}}}",
            )
        ],
    ),
    (
        "Writes paused by the moves completed in the last hour",
        "s",
        [
            (
                "sum by (cluster, mode) (increase(dbprovider_move_write_pause_seconds_sum{{{sel}}}[1h]))",
                "{{{{mode}}}} total",
            )
        ],
    ),
    (
        "Reconcile errors by reason",
        "ops",
        [
            (
                "sum by (cluster, controller, reason) "
                "(rate(dbprovider_reconcile_errors_total{{{sel}}}[$__rate_interval]))",
                "{{{{controller}}}} {{{{reason}}}}",
            )
        ],
    ),
    (
        "Reconcile conflicts",
        "ops",
        [
            (
                "sum by (cluster, controller) (rate(dbprovider_reconcile_conflicts_total{{{sel}}}[$__rate_interval]))",
                "{{{{controller}}}}",
            )
        ],
    ),
    (
        "API requests by route and code",
        "reqps",
        [
            (
                "sum by (cluster, method, route, code) "
                "(rate(dbprovider_api_requests_total{{{sel}}}[$__rate_interval]))",
                "{{{{method}}}} {{{{route}}}} {{{{code}}}}",
            )
        ],
    ),
    (
        "API connections: open, and refused or evicted by bound",
        "short",
        [
            ("sum by (cluster) (dbprovider_api_connections_open{{{sel}}})", "{{{{cluster}}}} open"),
            (
                "sum by (cluster, limit) (rate(dbprovider_api_connections_refused_total{{{sel}}}[$__rate_interval]))",
                "{{{{limit}}}} refused/s",
            ),
        ],
    ),
    (
        "API front door: connections dropped, requests refused, accept errors (by reason)",
        "ops",
        [
            (
                "sum by (cluster, reason) (rate(dbprovider_api_connections_dropped_total{{{sel}}}[$__rate_interval]))",
                "dropped {{{{reason}}}}",
            ),
            (
                "sum by (cluster, reason) (rate(dbprovider_api_requests_refused_total{{{sel}}}[$__rate_interval]))",
                "refused {{{{reason}}}}",
            ),
            (
                "sum by (cluster, errno) (rate(dbprovider_api_accept_errors_total{{{sel}}}[$__rate_interval]))",
                "accept {{{{errno}}}}",
            ),
        ],
    ),
    (
        "API latency p95 by route",
        "s",
        [
            (
                "histogram_quantile(0.95, sum by (cluster, method, route, le) "
                "(rate(dbprovider_api_request_duration_seconds_bucket{{{sel}}}[$__rate_interval])))",
                "{{{{method}}}} {{{{route}}}}",
            )
        ],
    ),
)


def _selectors(config: InstallConfig) -> dict[str, str]:
    return {"sel": f'{job_matcher(config)}, cluster=~"$cluster"', "shard": 'shard=~"$shard"'}


def dashboard_panels(config: InstallConfig) -> list[tuple[str, list[str]]]:
    """Every panel's title and queries, with the template variables still in them."""
    values = _selectors(config)
    return [(title, [expr.format(**values) for expr, _ in queries]) for title, _, queries in PANELS]


def _variables(config: InstallConfig) -> list[gd.QueryVariable | gd.DatasourceVariable]:
    job = job_matcher(config)
    cluster = (
        gd.QueryVariable("cluster")
        .label("cluster")
        .datasource(DATASOURCE)
        .query(f"label_values(up{{{job}}}, cluster)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
    )
    shard = (
        gd.QueryVariable("shard")
        .label("shard")
        .datasource(DATASOURCE)
        .query(f'label_values(dbprovider_shard_ready{{{job}, cluster=~"$cluster"}}, shard)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .all_value(".*")
    )
    return [gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"), cluster, shard]


def build_dashboard(config: InstallConfig) -> Any:
    """The dashboard model (grafana_foundation_sdk.models.dashboard.Dashboard)."""
    builder = (
        gd.Dashboard("Database provider")
        .uid(DASHBOARD_UID)
        .tags(["dbprovider"])
        .description("Fleet capacity, phases, provisioning age, reconcile errors and the consumer API.")
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
    )
    for variable in _variables(config):
        builder = builder.with_variable(variable)
    values = _selectors(config)
    for title, unit, queries in PANELS:
        panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).span(12).height(8)
        for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
            panel = panel.with_target(
                prometheus.Dataquery()
                .expr(expr.format(**values))
                .legend_format(legend.format())
                .ref_id(ref)
                .datasource(DATASOURCE)
            )
        builder = builder.with_panel(panel)
    return builder.build()


def dashboard_json(config: InstallConfig) -> str:
    return json.dumps(build_dashboard(config), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def dashboard_configmap(config: InstallConfig) -> dict[str, Any]:
    """The dashboard in a ConfigMap that the Grafana sidecar (label grafana_dashboard: "1") loads."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{config.release_name}-dashboard",
            "namespace": config.dashboard.namespace or config.namespace,
            "labels": {**config.dashboard.labels, **common_labels(config), SIDECAR_LABEL: "1"},
        },
        "data": {DASHBOARD_KEY: dashboard_json(config)},
    }
