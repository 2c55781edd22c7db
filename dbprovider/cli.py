"""Entry point of the `dbprovider` console script; each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dbprovider import consumer_cmd, lint, upgrade_check
from dbprovider.clitools import subcommand
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

    consumer_cmd.add_parser(commands)
    lint.add_parser(commands)
    upgrade_check.add_parser(commands)
    return parser


def _run_manager(args: argparse.Namespace) -> int:
    from dbprovider.manager import main_from_args

    return main_from_args(
        args.config,
        args.kubeconfig,
        args.namespace,
        args.api_port,
        args.metrics_port,
        args.admin_host_override,
        args.shard_ca_file,
    )


def _run_dev(args: argparse.Namespace) -> int:
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
    return run_dev(postgres_flavor=args.postgres, state_dir=args.state_dir, values_file=args.config)


def _run_render(args: argparse.Namespace) -> int:
    from dbprovider.render import run_render

    return run_render(
        config_path=args.config,
        only=args.only,
        output=args.output,
        fmt=args.format,
        time_scale=args.test_time_scale,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
