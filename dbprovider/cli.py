"""Entry point of the `dbprovider` console script; each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dbprovider",
        description="Places tenant PostgreSQL databases on shards and hands credentials to consumers.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = commands.add_parser(
        "dev",
        help="run the product locally on embedded defaults (real kube-apiserver, etcd and PostgreSQL)",
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
    dev.set_defaults(handler=_run_dev)

    render = commands.add_parser(
        "render",
        help="write the install's Kubernetes manifests as YAML (for a GitOps landscape repo)",
        description=(
            "Renders the objects `pulumi up` would create from an install config file (the same keys as the "
            "Pulumi stack config) as multi-document YAML. --only prometheusrule renders the PrometheusRule "
            "alone, for the central Prometheus' repository. An invalid config exits with status 2 and names "
            "the key."
        ),
    )
    render.add_argument("--config", required=True, metavar="FILE", help="the install config (YAML)")
    render.add_argument(
        "--only",
        choices=["manifests", "prometheusrule"],
        default="manifests",
        help="manifests: the DB cluster's objects (default); prometheusrule: the alert rule alone",
    )
    render.add_argument(
        "--output", "-o", default="-", metavar="FILE", help="where to write the YAML (default -, stdout)"
    )
    render.set_defaults(handler=_run_render)
    return parser


def _run_dev(args: argparse.Namespace) -> int:
    from dbprovider.dev import run_dev

    return run_dev(postgres_flavor=args.postgres, state_dir=args.state_dir)


def _run_render(args: argparse.Namespace) -> int:
    from dbprovider.render import run_render

    return run_render(config_path=args.config, only=args.only, output=args.output)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
