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
    return parser


def _run_dev(args: argparse.Namespace) -> int:
    from dbprovider.dev import run_dev

    return run_dev(postgres_flavor=args.postgres, state_dir=args.state_dir)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
