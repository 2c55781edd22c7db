"""Entry point of the `dbprovider` console script: every subcommand's arguments, declared here.

Each subcommand's work lives in its own module, imported only when that subcommand runs: `dbprovider
--help`, `dbprovider <cmd> --help` and each command start without the others' imports (the Kubernetes
client, psycopg and the reconciler for `upgrade check`; jinja and the CRD schemas for `consumer` and
`lint`). So nothing here may import an implementation module at the top: only domain.settings,
domain.constants, domain.version and clitools, which load no pydantic model.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from dbprovider.clitools import FORMAT_GITHUB, FORMAT_TEXT, subcommand
from domain.constants import DEFAULT_NAMESPACE, DEFAULT_RELEASE_NAME, DEFAULT_TOKEN_KEY
from domain.settings import SETTINGS
from domain.version import __version__


def build_parser() -> argparse.ArgumentParser:
    env, files = SETTINGS.env, SETTINGS.files
    parser = argparse.ArgumentParser(
        prog="dbprovider",
        description="Places tenant PostgreSQL databases on shards and hands credentials to consumers.",
    )
    parser.add_argument("--version", action="version", version=f"dbprovider {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = subcommand(
        commands,
        "dev",
        _run_dev,
        help="run the product locally on embedded defaults or your values (real kube-apiserver, etcd, PostgreSQL)",
        description=(
            "Starts a local kube-apiserver + etcd and a PostgreSQL shard on loopback, writes a kubeconfig "
            "and an env file, prints how to reach them, and runs until Ctrl-C or SIGTERM, then removes "
            "everything it started."
        ),
    )
    dev.add_argument(
        "--postgres", default="18", choices=["18", "16", "15"], help="PostgreSQL major of the shard (default 18)"
    )
    dev.add_argument(
        "--shard",
        default="postgres",
        choices=["postgres", "patroni"],
        help=(
            "postgres: one server (default); patroni: a Patroni cluster (a primary and a streaming replica) as "
            "the Shard's admin endpoint, with pgBouncer in transaction pool mode as its client endpoint "
            "(needs Debian's pgbouncer)"
        ),
    )
    dev.add_argument(
        "--state-dir",
        default=".dbprovider-dev",
        help="where the kubeconfig and env file are written (default ./.dbprovider-dev)",
    )
    dev.add_argument(
        "--config",
        metavar="FILE",
        help=(
            "your install values (YAML), merged onto dev's defaults; values that cannot work locally are refused "
            "with exit status 2, naming the key"
        ),
    )

    render = subcommand(
        commands,
        "render",
        _run_render,
        help="write the install's Kubernetes manifests as YAML (for a GitOps landscape repo)",
        description=(
            "Renders the objects `pulumi up` would create from an install config file (the same keys as the "
            "Pulumi stack config) as multi-document YAML. --only prometheusrule renders the PrometheusRule "
            "alone, for the central Prometheus' repository (--format rules: as a plain Prometheus rule file); "
            "--only dashboard renders the Grafana dashboard (--format configmap: as a ConfigMap for the "
            "Grafana sidecar). An invalid config exits with status 2 and names the key."
        ),
    )
    render.add_argument("--config", required=True, metavar="FILE", help="the install config (YAML)")
    render.add_argument(
        "--agent",
        action="store_true",
        help="render the consumer agent for a consumer cluster instead; --config is then the agent's values "
        "(docs/consumers.md); with --only prometheusrule, the agent's alert rules",
    )
    render.add_argument(
        "--only",
        choices=["manifests", "prometheusrule", "dashboard"],
        default="manifests",
        help="manifests: the DB cluster's objects (default); prometheusrule: the alert rules alone; "
        "dashboard: the Grafana dashboard",
    )
    render.add_argument(
        "--format",
        choices=["prometheusrule", "rules", "json", "configmap"],
        default=None,
        help="prometheusrule (default) or rules (a plain Prometheus rule file) for --only prometheusrule; "
        "json (default) or configmap for --only dashboard",
    )
    render.add_argument(
        "--test-time-scale",
        type=int,
        default=1,
        metavar="N",
        help="TESTS ONLY: divide every for:, range window and age threshold of the rules by N",
    )
    render.add_argument(
        "--output", "-o", default="-", metavar="FILE", help="where to write the YAML (default -, stdout)"
    )

    manager = subcommand(
        commands,
        "manager",
        _run_manager,
        help="run one replica: the consumer API (TLS), the leader-elected controllers and /metrics",
        description=(
            "Serves the consumer API over TLS on --api-port, runs the Shard/Database/Consumer controllers "
            "while this replica holds the Lease, and serves Prometheus metrics on --metrics-port. Stops "
            f"cleanly on SIGTERM. TLS files: {env.tls_cert} / {env.tls_key} (default "
            f"{files.tls_cert} and {files.tls_key})."
        ),
    )
    manager.add_argument(
        "--config",
        default=os.environ.get(env.config, files.config),
        metavar="FILE",
        help=f"the install config (default ${env.config} or {files.config})",
    )
    manager.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig file (default: in-cluster)"
    )
    manager.add_argument(
        "--namespace", default=None, help=f"release namespace (default ${env.pod_namespace} or config)"
    )
    manager.add_argument("--api-port", type=int, default=SETTINGS.ports.api)
    manager.add_argument("--metrics-port", type=int, default=SETTINGS.ports.metrics)
    manager.add_argument(
        "--admin-host-override",
        default=os.environ.get("DBPROVIDER_ADMIN_HOST_OVERRIDE"),
        help="connect to every shard's admin port on this host instead of its Service (outside a cluster only)",
    )

    manager.add_argument(
        "--shard-ca-file",
        default=os.environ.get(env.shard_ca),
        metavar="PATH",
        help=(
            "PEM CA certificates that verify shard servers under sslmode verify-ca/verify-full, for a manager "
            f"outside a pod (default ${env.shard_ca}; in a pod, {files.shard_ca}, mounted from shardTLS.caBundle)"
        ),
    )
    manager.add_argument(
        "--quota-reservation-timeout",
        type=float,
        default=SETTINGS.quota.reservation_timeout,
        metavar="SECONDS",
        help=(
            "how long a reserved quota slot whose database the apiserver does not have keeps counting (default "
            f"{SETTINGS.quota.reservation_timeout:.0f}); keep it above the apiserver's --request-timeout"
        ),
    )

    _add_agent(commands)
    _add_consumer(commands)
    _add_lint(commands)
    _add_upgrade(commands)
    _add_move(commands)
    return parser


def _group(commands: Any, name: str, metavar: str, *, help: str, description: str) -> Any:
    """A command whose own subcommands do the work (`consumer new`, `upgrade check`): its add_subparsers()."""
    parser = commands.add_parser(name, help=help, description=description)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar=metavar)


def _add_agent(commands: Any) -> None:
    agent = subcommand(
        commands,
        "agent",
        _run_agent,
        help="run the consumer agent: DatabaseClaims in this cluster, kept by the provider's API",
        description=(
            "Runs in a consumer cluster: creates the databases its DatabaseClaims ask for at the provider, "
            "writes and keeps their Secrets (servicebinding.io), rotates and deletes them. Leader-elected on "
            "a Lease in --namespace. The token file is re-read on every request, the CA file when it "
            "changes. Stops cleanly on SIGTERM."
        ),
    )
    agent.add_argument(
        "--provider-url", default=os.environ.get("DBPROVIDER_API_URL"), help="the provider's API (https://...)"
    )
    agent.add_argument(
        "--token-file",
        default=os.environ.get("DBPROVIDER_TOKEN_FILE", "/var/run/dbprovider-agent/token/token"),
        metavar="FILE",
        help="the consumer's bearer token (a mounted Secret; default $DBPROVIDER_TOKEN_FILE)",
    )
    agent.add_argument(
        "--ca-file",
        default=os.environ.get("DBPROVIDER_CA_FILE"),
        metavar="FILE",
        help="PEM CA of the provider's API certificate (default $DBPROVIDER_CA_FILE; else the system CAs)",
    )
    agent.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig file (default: in-cluster)"
    )
    agent.add_argument(
        "--namespace",
        default=os.environ.get(SETTINGS.env.pod_namespace, "dbprovider-agent"),
        help=f"the agent's namespace, where its Lease is (default ${SETTINGS.env.pod_namespace})",
    )
    agent.add_argument("--watch-namespace", default=None, help="only claims of this namespace (default: all)")
    agent.add_argument("--lease-name", default="dbprovider-agent", help="the Lease the replicas elect a leader on")
    agent.add_argument("--poll-interval", type=float, default=30.0, metavar="SECONDS", help="default 30")
    agent.add_argument(
        "--max-backoff",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="the longest wait between tries while the provider is away (default 300)",
    )
    agent.add_argument(
        "--no-leader-election", action="store_true", help="run passes without the Lease (one replica only)"
    )
    agent.add_argument(
        "--metrics-port",
        type=int,
        default=SETTINGS.ports.agent,
        metavar="PORT",
        help=f"plain-HTTP port of /metrics, /healthz and /readyz (default {SETTINGS.ports.agent}; 0: a free port)",
    )
    agent.add_argument("--metrics-host", default="0.0.0.0", help="address that port listens on (default 0.0.0.0)")  # noqa: S104


def _run_agent(args: argparse.Namespace) -> int:
    from dbprovider.agent_cmd import run_agent

    return run_agent(args)


def _add_consumer(commands: Any) -> None:
    summary = "make a consumer's YAML and token, or rotate its token (files only, never the cluster)"
    description = "Write Consumer and token-hash Secret YAML for the landscape repository."
    actions = _group(commands, "consumer", "ACTION", help=summary, description=description)
    token_help = (
        "write the token to FILE (mode 0600, must not exist) instead of the terminal; '-' prints it alone on "
        "stdout. Required when stdout is not a terminal"
    )

    new = subcommand(
        actions,
        "new",
        _run_consumer_new,
        help="a new consumer: a fresh token, its Consumer and hash Secret as YAML",
        description=(
            "Makes a 256-bit token, prints it once to the terminal, and writes NAME.consumer.yaml (the Consumer) "
            "and NAME.token-secret.yaml (the Secret NAME-token holding only the token's SHA-256) into --out. "
            "Refuses to run without --max-databases unless --no-quota is given: set a quota on every consumer. "
            "Existing files are never overwritten."
        ),
    )
    new.add_argument("name", metavar="NAME", help="the Consumer's name (a DNS-1123 subdomain)")
    quota = new.add_mutually_exclusive_group()
    quota.add_argument("--max-databases", type=int, metavar="N", help="the consumer's quota of databases")
    quota.add_argument("--no-quota", action="store_true", help="deliberately write a Consumer without a quota")
    new.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        metavar="NS",
        help=f"the release namespace, where the hash Secret lives (default {DEFAULT_NAMESPACE})",
    )
    new.add_argument("--out", default=".", metavar="DIR", help="directory for the two YAML files (default .)")
    new.add_argument("--key", default=DEFAULT_TOKEN_KEY, help=f"the Secret key (default {DEFAULT_TOKEN_KEY})")
    new.add_argument("--token-file", metavar="FILE", help=token_help)

    rotate = subcommand(
        actions,
        "rotate",
        _run_consumer_rotate,
        help="add a new token's hash to a hash Secret file; --drop-old keeps only the newest line",
        description=(
            "Without --drop-old: makes a new token, prints it once and appends its SHA-256 as a line of the "
            "Secret's key, so the old and the new token both authenticate until the consumer has switched. "
            "With --drop-old: makes no token and keeps only the last (newest) hash line. Rewrites the YAML "
            "file in place (comments in it are not kept); never touches the cluster."
        ),
    )
    rotate.add_argument("--secret-file", required=True, metavar="FILE", help="the YAML file with the hash Secret")
    rotate.add_argument("--key", default=DEFAULT_TOKEN_KEY, help=f"the Secret key (default {DEFAULT_TOKEN_KEY})")
    mode = rotate.add_mutually_exclusive_group()
    mode.add_argument("--drop-old", action="store_true", help="remove every line but the newest hash")
    mode.add_argument("--token-file", metavar="FILE", help=token_help)


def _add_lint(commands: Any) -> None:
    lint = subcommand(
        commands,
        "lint",
        _run_lint,
        help="check Shard, Consumer, Secret and install-values YAML offline, with the provider's own rules",
        description=(
            "Validates the landscape repository's YAML with the rules the CRDs and the provider apply, plus the "
            "rules between objects that otherwise only show at run time. One line per finding (file, object, "
            "field); exit 1 if any finding is an error, 2 for bad arguments."
        ),
    )
    lint.add_argument("paths", nargs="+", metavar="PATH", help="YAML files or directories (searched recursively)")
    lint.add_argument("--values", metavar="FILE", help="the install values of this DB cluster")
    lint.add_argument(
        "--format",
        choices=[FORMAT_TEXT, FORMAT_GITHUB],
        default=FORMAT_TEXT,
        help="text (default) or github (workflow-command annotations on the merge request's files)",
    )
    lint.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="also compare each Shard's maxDatabases with the databases already placed on it in that cluster",
    )


def _add_upgrade(commands: Any) -> None:
    summary = "before an upgrade: what this release will refuse on a live cluster (read-only)"
    description = "Commands for upgrading a running install to this release (docs/upgrade.md)."
    steps = _group(commands, "upgrade", "COMMAND", help=summary, description=description)
    check = subcommand(
        steps,
        "check",
        _run_upgrade_check,
        help="list what this release will refuse or change on the live cluster; changes nothing",
        description=(
            f"Reads the install (its ConfigMap, Deployment, CRDs, Shards, Consumers, Databases) and reports what "
            f"{__version__} will refuse (errors), report differently (warnings) or do once (notices). One line per "
            "finding; exit 1 if any error, 2 if the cluster cannot be read. Read-only: GETs only, and with "
            "--shard-sql read-only admin sessions."
        ),
    )
    _cluster_arguments(check)
    check.add_argument(
        "--config", metavar="FILE", help="the install values you will upgrade with (default: the live ConfigMap's)"
    )
    check.add_argument(
        "--shard-sql",
        action="store_true",
        help="also read each shard's catalog over a read-only admin session (tenant ownership records, SCRAM)",
    )
    _shard_access_arguments(check)


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a command that reads a live install finds it."""
    parser.add_argument("--kubeconfig", required=True, metavar="FILE", help="the DB cluster's kubeconfig")
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"release namespace (default {DEFAULT_NAMESPACE})"
    )
    parser.add_argument(
        "--release", default=DEFAULT_RELEASE_NAME, help=f"release name (default {DEFAULT_RELEASE_NAME})"
    )


def _shard_access_arguments(parser: argparse.ArgumentParser) -> None:
    """How a command run outside the cluster reaches the shards' admin ports."""
    parser.add_argument(
        "--admin-host-override", metavar="HOST", help="reach every shard's admin port on this host (port-forwards)"
    )
    parser.add_argument(
        "--shard-ca-file", metavar="PATH", help=f"CA bundle for verify-ca/-full shards (as ${SETTINGS.env.shard_ca})"
    )


def _add_move(commands: Any) -> None:
    summary = "moving a database between shards: what the shards lack for an online or offline move (read-only)"
    description = "Commands for moving a tenant database from one shard to another (docs/operations.md)."
    steps = _group(commands, "move", "COMMAND", help=summary, description=description)
    check = subcommand(
        steps,
        "check",
        _run_move_check,
        help="list what two shards (and a database) lack for an online move, and what the offline path needs",
        description=(
            "Logs in to both shards as their provisioner and reports, one line each, what stands in the way of "
            "an online move: per shard the server version, wal_level, the provisioner's REPLICATION and "
            "pg_create_subscription, free replication slots and WAL senders; with --database, its tables "
            "without a replica identity, its large objects and extensions the target lacks. Then the offline "
            "path: the pg_dump and pg_restore of the target's major found as the manager finds them "
            "(DBPROVIDER_PG_TOOLS, DBPROVIDER_PG_DUMP, DBPROVIDER_PG_RESTORE, PATH) on this machine, and with "
            "--database its size against moves.offlineMaxSize. Exit 0 when an "
            "online move is possible, 1 when something is missing, 2 when the cluster or a shard cannot be read. "
            "Changes nothing, but for --database a CONNECT grant to the provisioner for its own login, revoked "
            "right after."
        ),
    )
    check.add_argument("--shard", required=True, metavar="NAME", help="the Shard the database is on")
    check.add_argument("--target", required=True, metavar="NAME", help="the Shard to move it to")
    check.add_argument("--database", metavar="NAME", help="also check this Database (in the release namespace)")
    _cluster_arguments(check)
    _shard_access_arguments(check)


def _run_manager(args: argparse.Namespace) -> int:
    from dbprovider.manager import main_from_args
    from domain.admin_access import OutsidePod

    return main_from_args(
        args.config,
        args.kubeconfig,
        args.namespace,
        args.api_port,
        args.metrics_port,
        OutsidePod(args.admin_host_override, args.shard_ca_file),
        args.quota_reservation_timeout,
    )


def _run_dev(args: argparse.Namespace) -> int:
    from dbprovider.dev_values import checked_dev_values
    from domain.config import ConfigError

    try:
        overrides = checked_dev_values(args.config)
    except ConfigError as exc:
        print(f"dbprovider dev: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        from dbprovider.dev import run_dev
    except ModuleNotFoundError as exc:
        if exc.name != "harness":
            raise
        # The wheel and the image ship the runtime only; dev starts the test harness' servers.
        print(
            "dbprovider dev: runs from a source checkout of dbprovider (`make dev` there): it starts the test "
            "harness' kube-apiserver, etcd and PostgreSQL, which the installed package does not include",
            file=sys.stderr,
        )
        return 2
    return run_dev(postgres_flavor=args.postgres, state_dir=args.state_dir, overrides=overrides, shard=args.shard)


def _run_render(args: argparse.Namespace) -> int:
    from dbprovider.render import run_render, run_render_agent

    if args.agent:
        return run_render_agent(
            args.config, args.output, only=args.only, fmt=args.format, time_scale=args.test_time_scale
        )
    return run_render(
        config_path=args.config,
        only=args.only,
        output=args.output,
        fmt=args.format,
        time_scale=args.test_time_scale,
    )


def _run_consumer_new(args: argparse.Namespace) -> int:
    from dbprovider.consumer_cmd import run_new

    return run_new(args)


def _run_consumer_rotate(args: argparse.Namespace) -> int:
    from dbprovider.consumer_cmd import run_rotate

    return run_rotate(args)


def _run_lint(args: argparse.Namespace) -> int:
    from dbprovider.lint import run_lint

    return run_lint(args)


def _run_upgrade_check(args: argparse.Namespace) -> int:
    from dbprovider.upgrade_check import run_upgrade_check

    return run_upgrade_check(args)


def _run_move_check(args: argparse.Namespace) -> int:
    from dbprovider.move_check import run_move_check

    return run_move_check(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
