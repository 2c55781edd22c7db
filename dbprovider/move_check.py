"""`dbprovider move check`: what two shards (and one database) lack for an online move, and what the
offline path needs, read-only.

Reads the install's config and the two Shards from the DB cluster, logs in to each shard as its
provisioner (as the manager does, `--admin-host-override` for port-forwards) and reports, one line
each, what `reconciler.sql.move_preflight` finds: per shard what it lacks for the online path, and
with `--database` what in that database logical replication would not carry. Then the offline path:
the pg_dump and pg_restore a move between the two shards' majors would copy with, found by the
manager's rules (reconciler.move.tools) on this machine, and with `--database` its size against `moves.offlineMaxSize`.
Exit 0 when an online move is possible, 1 when something is missing for it, 2 when the cluster or a
shard cannot be read.

    dbprovider move check --kubeconfig eu-1.kubeconfig --shard pg-old --target pg-new --database orders
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import kubernetes
import psycopg
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from dbprovider.clitools import EXIT_FINDINGS, EXIT_INVALID, EXIT_OK
from dbprovider.upgrade_facts import live_install_config
from domain.admin_access import OutsidePod
from domain.config import MovesConfig
from domain.objects import lenient_status
from domain.resources import DATABASES, SHARDS
from domain.specs import parse_shard
from domain.status import DatabaseStatus
from informers import Rest
from reconciler.move.tools import ClientTools
from reconciler.shard.admin import AdminPolicy, AdminRefused, AdminSecretInvalid, admin_endpoint
from reconciler.sql.errors import classify
from reconciler.sql.move_offline import database_size
from reconciler.sql.move_preflight import (
    EXTENSION_MISSING,
    Obstacle,
    available_extensions,
    database_obstacles,
    read_shard,
    shard_obstacles,
    tenant_database,
)
from reconciler.sql.session import AdminEndpoint, connect_admin
from reconciler.sql.tenant import validate_tenant_name

APPLICATION_NAME = "dbprovider-move-check"


class CheckError(RuntimeError):
    """A shard, the cluster or the database could not be read; the message carries no secret."""


@dataclass(frozen=True)
class Shards:
    """Where the check logs in: each shard's admin endpoint, and the database's tenant (if asked)."""

    source: AdminEndpoint
    target: AdminEndpoint
    tenant: str | None = None
    offline_max_bytes: int = MovesConfig().offline_max_bytes  # moves.offlineMaxSize of the install


@dataclass(frozen=True)
class Offline:
    """What the check found for the offline path."""

    majors: tuple[int, int]  # the source's and the target's PostgreSQL major
    size: int | None = None  # the database's size in bytes (with --database)
    extensions_missing: int = 0  # extensions of the database the target does not offer


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def offline_lines(names: tuple[str, str], found: Offline, max_bytes: int) -> list[tuple[str, bool]]:
    """The offline path's report, one (line, obstacle?) each: the copy tools (by the manager's rules,
    on this machine) against both shards' majors, and the database's size against the limit."""
    lines: list[tuple[str, bool]] = []
    source, target = found.majors
    chosen = ClientTools.from_environment().for_move(source, target)
    if isinstance(chosen, str):
        lines.append((f"offline: {chosen} [binaries]", True))
    elif chosen.pg_restore is None:
        lines.append((f"offline: no pg_restore of PostgreSQL {chosen.major} where the manager runs [binaries]", True))
    else:
        lines.append(
            (
                f"offline: pg_dump {chosen.pg_dump} and pg_restore {chosen.pg_restore} of PostgreSQL {chosen.major} "
                f"copy from shard {names[0]} (PostgreSQL {source}) to shard {names[1]} (PostgreSQL {target})",
                False,
            )
        )
    limit = f"moves.offlineMaxSize {_mib(max_bytes)}"
    if found.size is not None and found.size > max_bytes:
        lines.append(
            (
                f"offline: the database is {_mib(found.size)}, above {limit}: its writes would pause "
                "for the whole copy; a DatabaseMove needs spec.force: true [offline_size]",
                True,
            )
        )
    elif found.size is not None:
        lines.append((f"offline: the database is {_mib(found.size)}, within {limit}", False))
    else:
        lines.append((f"offline: databases up to {limit} are moved without spec.force (--database: its size)", False))
    if found.extensions_missing:
        lines.append(
            (f"offline: {found.extensions_missing} extension(s) missing on the target (above) [extension]", True)
        )
    return lines


@contextlib.contextmanager
def _session(endpoint: AdminEndpoint, shard: str) -> Iterator[psycopg.Connection]:
    try:
        conn = connect_admin(endpoint, application_name=APPLICATION_NAME)
    except Exception as exc:  # noqa: BLE001 - classified, never echoed (it may carry the password)
        raise CheckError(f"shard {shard}: cannot log in ({classify(exc, 'check').error_class})") from None
    with conn:
        yield conn


def check_move(names: tuple[str, str], shards: Shards, database: str | None, out: TextIO) -> int:
    """Print what the source and target shards (and the database) lack; the exit status."""
    source_name, target_name = names
    found: list[tuple[str, Obstacle]] = []
    size: int | None = None
    try:
        with _session(shards.source, source_name) as source, _session(shards.target, target_name) as target:
            facts = read_shard(source), read_shard(target)
            for name, fact in zip(names, facts, strict=True):
                found += [(f"shard {name}", obstacle) for obstacle in shard_obstacles(fact)]
            if shards.tenant is not None:
                extensions = available_extensions(target)
                with tenant_database(source, shards.tenant) as inside:
                    found += [(f"database {database}", o) for o in database_obstacles(inside, extensions)]
                size = database_size(source, shards.tenant)
    except CheckError as exc:
        print(f"error: {exc}", file=out)
        return EXIT_INVALID
    except psycopg.Error as exc:
        print(f"error: reading the shards failed ({classify(exc, 'check').error_class})", file=out)
        return EXIT_INVALID
    for where, obstacle in found:
        print(f"{where}: {obstacle.message} [{obstacle.code}]", file=out)
    if found:
        print(f"online move not possible: {len(found)} obstacle(s)", file=out)
    else:
        print(f"online move possible from shard {source_name} to shard {target_name}", file=out)
    missing = sum(1 for _, o in found if o.code == EXTENSION_MISSING)
    offline = offline_lines(names, Offline((facts[0].major, facts[1].major), size, missing), shards.offline_max_bytes)
    for line, _ in offline:
        print(line, file=out)
    blocking = sum(1 for _, obstacle in offline if obstacle)
    if blocking:
        print(f"offline move not possible: {blocking} obstacle(s)", file=out)
    else:
        print(f"offline move possible from shard {source_name} to shard {target_name}", file=out)
    return EXIT_FINDINGS if found else EXIT_OK


def read_shards(args: argparse.Namespace) -> Shards:
    """The two shards' admin endpoints (and the database's tenant) from the DB cluster."""
    outside = OutsidePod(args.admin_host_override, args.shard_ca_file)
    try:
        with kubernetes.config.new_client_from_config(config_file=args.kubeconfig) as client:
            rest = Rest(client)
            config, _, source = live_install_config(rest, args.namespace, args.release, None)
            if config is None:
                raise CheckError(f"the install config in {source} is invalid")
            policy = AdminPolicy.from_config(config, outside.ca_file)
            endpoints = [_endpoint(rest, name, policy, outside.admin_host) for name in (args.shard, args.target)]
            tenant = _tenant(rest, args.namespace, args.database, args.shard) if args.database else None
    except ApiException as exc:
        raise CheckError(f"reading the cluster failed with HTTP {exc.status}") from None
    except (ConfigException, HTTPError, OSError) as exc:
        raise CheckError(f"cannot read the cluster: {type(exc).__name__}") from None
    return Shards(endpoints[0], endpoints[1], tenant, config.moves.offline_max_bytes)


def _endpoint(rest: Rest, name: str, policy: AdminPolicy, host: str | None) -> AdminEndpoint:
    obj = _get(rest, SHARDS, name, None, f"no Shard {name}")
    try:
        spec = parse_shard(obj)
    except ValidationError:
        raise CheckError(f"Shard {name} has an invalid spec") from None
    try:
        return admin_endpoint(rest, name, spec, policy, host)
    except AdminSecretInvalid:
        raise CheckError(f"shard {name}: its admin Secret is invalid") from None
    except AdminRefused as exc:
        raise CheckError(f"shard {name}: {exc}") from None


def _tenant(rest: Rest, namespace: str, database: str, shard: str) -> str:
    obj = _get(rest, DATABASES, database, namespace, f"no Database {database} in namespace {namespace}")
    status = lenient_status(DatabaseStatus, obj)
    if status.shard != shard or not status.tenant_name:
        raise CheckError(f"Database {database} is not placed on shard {shard}")
    return validate_tenant_name(status.tenant_name)


def _get(rest: Rest, resource: Any, name: str, namespace: str | None, missing: str) -> dict[str, Any]:
    try:
        obj: dict[str, Any] = rest.get(resource, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise CheckError(missing) from None
        raise
    return obj


def run_move_check(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    if args.shard == args.target:
        print("error: --shard and --target name the same shard", file=out)
        return EXIT_INVALID
    try:
        shards = read_shards(args)
    except CheckError as exc:
        print(f"error: {exc}", file=out)
        return EXIT_INVALID
    return check_move((args.shard, args.target), shards, args.database, out)
