"""`dbprovider upgrade check`: what this release will refuse on a live cluster, before the upgrade.

Run it with the CLI of the release you are about to install, against the DB cluster that runs the
current one. It reads (dbprovider.upgrade_facts) and changes nothing. Each rule is one small
function in `CHECKS`: a rule another change adds (a new refusal of this release) is one more row.
A rule about single Shards says what is wrong with one; `_each_shard` runs it for every Shard.
Findings are errors (this release refuses it: fix it first), warnings (it keeps working but is
reported differently) or notices (what the upgrade will do, or what was not checked). Exit 1 on
any error, 2 when the cluster cannot be read.

    dbprovider upgrade check --kubeconfig eu-1.kubeconfig
    dbprovider upgrade check --kubeconfig eu-1.kubeconfig --shard-sql   # also ask each shard (in the cluster)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from pydantic import ValidationError

from dbprovider.clitools import EXIT_FINDINGS, EXIT_INVALID, EXIT_OK
from dbprovider.upgrade_facts import LiveInstall, LiveInstallError, ShardSqlFact, read_live_install
from domain.admin_access import UNBOUND_ADVICE, OutsidePod, tls_refusal
from domain.conditions import READY, Condition, object_conditions
from domain.connection_budget import Commitments, budget, provider_sessions
from domain.constants import SERVED_VERSIONS, Phase, ShardReason
from domain.metadata import ObjectMeta
from domain.specs import ShardSpec
from domain.version import UPGRADES_FROM, __version__, parse_version
from reconciler.sql.errors import INSECURE_AUTH_REFUSED
from reconciler.sql.tenant import Ownership

ERROR, WARNING, NOTICE = "error", "warning", "notice"


@dataclass(frozen=True)
class Finding:
    severity: str
    rule: str
    obj: str  # "Shard/pg-1", "Database/ns/name", "install"
    message: str

    def text(self) -> str:
        return f"{self.severity}: {self.obj}: {self.message} [{self.rule}]"


Rule = Callable[[LiveInstall], Iterable[tuple[str, str, str]]]  # yields (severity, object, message)
ShardRule = Callable[[LiveInstall, "ShardFacts"], Iterable[str]]  # yields what is wrong with one Shard


@dataclass(frozen=True)
class Check:
    """One rule: its id, what it makes sure of, and the function that finds what breaks it."""

    rule: str
    ensures: str
    find: Rule


# -- the rules ----------------------------------------------------------------------------------------


def _release_path(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
    if live.deployment is None:
        yield NOTICE, "install", f"no Deployment {live.release} in {live.namespace}: the running release is unknown"
        return
    installed = live.installed_version or UPGRADES_FROM  # 0.1.0 labelled nothing with its version
    where = f"Deployment/{live.namespace}/{live.release}"
    if parse_version(installed) > parse_version(__version__):
        yield (
            ERROR,
            where,
            (f'runs {installed}, newer than {__version__}: this is a rollback, see docs/upgrade.md ("Rolling back")'),
        )
    elif parse_version(installed) < parse_version(UPGRADES_FROM):
        yield ERROR, where, f"runs {installed}: upgrade to {UPGRADES_FROM} first (one release at a time)"
    elif installed == __version__:
        yield NOTICE, where, f"runs {__version__} already"


def _install_config(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
    for path, message in live.config_problems:
        yield ERROR, "install", f"{live.config_source}: {path}: {message} (this release refuses to render or start)"


def _stored_versions(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
    for crd in live.crds.values():
        stored = (crd.get("status") or {}).get("storedVersions") or []  # a CRD's: apiextensions, no model of ours
        for version in stored:
            if version not in SERVED_VERSIONS:
                yield (
                    ERROR,
                    f"CustomResourceDefinition/{ObjectMeta.of(crd).name}",
                    (
                        f"objects are stored as {version}, which this release does not serve: its CRD cannot be "
                        'applied until they are migrated (docs/upgrade.md, "CRD versions")'
                    ),
                )


@dataclass(frozen=True)
class ShardFacts:
    """What the rules about one Shard read of it: its object, its spec (None: invalid) and what its admin
    session showed (None: not asked, without --shard-sql)."""

    name: str
    obj: dict[str, Any]
    spec: ShardSpec | None
    sql: ShardSqlFact | None


def _each_shard(severity: str) -> Callable[[ShardRule], Rule]:
    """A rule of a function that says what is wrong with one Shard: it runs for every Shard in name
    order, and each message it yields is a finding of `severity` on that Shard."""

    def rule(problems: ShardRule) -> Rule:
        def find(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
            for name in sorted(live.shards):
                shard = ShardFacts(name, live.shards[name], live.shard_spec(name), (live.shard_sql or {}).get(name))
                for message in problems(live, shard):
                    yield severity, f"Shard/{name}", message

        return find

    return rule


@_each_shard(ERROR)
def _admin_secrets_listed(live: LiveInstall, shard: ShardFacts) -> Iterator[str]:
    if live.config is None or shard.spec is None:
        return
    listed = {(ref.namespace, ref.name) for ref in live.config.shard_secrets}
    ref = shard.spec.admin.secret_ref
    if (ref.namespace, ref.name) not in listed:
        yield (
            f"its admin Secret {ref.namespace}/{ref.name} is not in shardSecrets: it is never read, the shard "
            "is not Ready (AdminSecretInvalid). Add it to shardSecrets, also in the release namespace"
        )


@_each_shard(ERROR)
def _admin_tls(live: LiveInstall, shard: ShardFacts) -> Iterator[str]:
    cleartext = live.config.shard_tls.cleartext_shards if live.config is not None else ()
    refusal = None if shard.spec is None else tls_refusal(shard.name, shard.spec.admin.sslmode, cleartext)
    if refusal is not None:
        yield (
            f"{refusal}: the shard would be AdminTlsRequired (no placements, no SQL). Turn TLS on, or only "
            "where the server cannot do TLS, add the shard to shardTLS.cleartextShards in the new config"
        )


@_each_shard(ERROR)
def _admin_endpoint(live: LiveInstall, shard: ShardFacts) -> Iterator[str]:
    # The Secrets are read with --shard-sql only; tenant-ownership says it was not run.
    refusal = shard.sql.refusal if shard.sql is not None else None
    if refusal is not None and refusal[0] == ShardReason.ADMIN_ENDPOINT_MISMATCH:
        yield (
            f"{refusal[1]}: the shard would be AdminEndpointMismatch (no placements, no SQL). Point "
            "spec.admin at the Service the Secret names, or bind the Secret in shardSecrets[].host/port"
        )


def _admin_secret_bound(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
    for fact in live.admin_secrets:
        where = f"Secret/{fact.namespace}/{fact.name}"
        if fact.bound is None:
            yield NOTICE, where, f"{fact.unread}: whether this admin Secret is bound to an endpoint was not checked"
        elif not fact.bound:
            yield WARNING, where, f"this admin Secret {UNBOUND_ADVICE}"


@_each_shard(WARNING)
def _connection_budget(live: LiveInstall, shard: ShardFacts) -> Iterator[str]:
    if shard.sql is None or shard.sql.slots is None or live.config is None:
        return
    provider = provider_sessions(live.config.workers_per_shard)  # the new config's, as the new leader counts
    settings = live.config.connection_budget
    shard_budget = budget(shard.sql.slots, provider, settings.reserved, settings.overcommit_of(shard.name))
    limits = (
        db.connection_limit
        for db in live.databases
        if db.shard == shard.name and db.phase != Phase.DELETED and not db.disabled
    )
    committed = Commitments.of(limits).total(shard_budget)
    if committed > shard_budget:
        yield (
            f"its databases commit {committed} connections, more than its budget of {shard_budget} "
            f"(max_connections {shard.sql.slots.max_connections}): it keeps working but takes no new databases "
            "(ConnectionBudgetExceeded). Raise max_connections or lower connectionBudget.reserved"
        )


def _insecure_auth_reported(shard: dict[str, Any]) -> bool:
    """The Shard's Ready condition says the server offers no SCRAM. Each condition is parsed alone, so a
    status field (or another condition) the running release wrote and this one would refuse hides nothing."""
    for raw in object_conditions(shard):
        try:
            condition = Condition.model_validate(raw)
        except ValidationError:
            continue
        if condition.type == READY:
            return condition.reason == ShardReason.ADMIN_AUTH_FAILED and INSECURE_AUTH_REFUSED in condition.message
    return False


@_each_shard(ERROR)
def _admin_scram(live: LiveInstall, shard: ShardFacts) -> Iterator[str]:
    refused = shard.sql is not None and shard.sql.error_class == INSECURE_AUTH_REFUSED
    if refused or _insecure_auth_reported(shard.obj):
        yield (
            "the server offers the provisioner only md5 or cleartext, never SCRAM: the provider sends it no "
            "password. Set password_encryption = scram-sha-256, set the provisioner's password again, and use "
            "scram-sha-256 in pg_hba.conf"
        )


def _tenant_ownership(live: LiveInstall) -> Iterator[tuple[str, str, str]]:
    if live.shard_sql is None:
        yield (
            NOTICE,
            "install",
            (
                "tenant ownership records not checked: run with --shard-sql where the shards' admin Services are "
                "reachable (in the cluster, or with --admin-host-override)"
            ),
        )
        return
    for shard, fact in sorted(live.shard_sql.items()):
        if fact.error_class is not None and fact.error_class != INSECURE_AUTH_REFUSED:
            yield WARNING, f"Shard/{shard}", f"not asked: {fact.error_class}"
    databases = {db.name: db for db in live.databases}
    for fact in live.shard_sql.values():
        for name, check in sorted(fact.tenants.items()):
            db = databases[name]
            if db.phase == Phase.DELETING:
                continue  # the drop needs no record; a recovered one is checked once it is Ready
            where = f"Database/{live.namespace}/{name}"
            why = f" ({'; '.join(check.problems)})" if check.problems else ""
            if check.verdict in (Ownership.FOREIGN, Ownership.OTHER_OWNER):
                if not db.provisioned:
                    yield (
                        ERROR,
                        where,
                        f"a role of its tenant's name is not its own{why}: provisioning fails with "
                        "name_taken. Check whose role it is; drop it, or record it (docs/upgrade.md)",
                    )
                else:
                    yield (
                        WARNING,
                        where,
                        f"{check.verdict.value.replace('_', ' ')}{why}: keeps working, reported as "
                        "OwnershipRecorded=False, not adopted (docs/operations.md)",
                    )
            elif check.verdict == Ownership.ADOPTABLE:
                if not db.provisioned:
                    yield NOTICE, where, "its tenant role has no ownership record: provisioning records it"
                elif db.held:
                    yield (
                        WARNING,
                        where,
                        (
                            "its tenant has no ownership record and the Database is held (no SQL while held): "
                            "restore-tenant refuses it until the record is written (docs/operations.md)"
                        ),
                    )
                else:
                    yield NOTICE, where, "its tenant has no ownership record: it is adopted once (TenantAdopted)"
            elif check.verdict == Ownership.MISSING and db.provisioned:
                yield WARNING, where, "its tenant is not on its shard (OwnershipRecorded=False, TenantMissing)"


CHECKS: tuple[Check, ...] = (
    Check("release-path", "the installed release upgrades to this one directly", _release_path),
    Check("install-config", "the install config is valid for this release", _install_config),
    Check("crd-stored-versions", "every stored version of the CRDs is served by this release", _stored_versions),
    Check("admin-secret-listed", "every Shard's admin Secret is listed in shardSecrets", _admin_secrets_listed),
    Check("admin-tls", "every Shard's admin connection uses TLS", _admin_tls),
    Check("admin-endpoint", "every admin Secret goes only to the endpoint it names", _admin_endpoint),
    Check("admin-secret-bound", "every admin Secret is bound to the endpoint it belongs to", _admin_secret_bound),
    Check("admin-scram", "every shard offers the provisioner SCRAM", _admin_scram),
    Check("connection-budget", "no shard's databases commit more connections than its budget", _connection_budget),
    Check("tenant-ownership", "every tenant carries its Database's ownership record, or gets it", _tenant_ownership),
)


def run_checks(live: LiveInstall, checks: Iterable[Check] = CHECKS) -> list[Finding]:
    return [
        Finding(severity, check.rule, obj, message) for check in checks for severity, obj, message in check.find(live)
    ]


# -- the command --------------------------------------------------------------------------------------


def run_upgrade_check(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        live = read_live_install(
            args.kubeconfig,
            args.namespace,
            args.release,
            args.config,
            shard_sql=args.shard_sql,
            outside_pod=OutsidePod(args.admin_host_override, args.shard_ca_file),
        )
    except (LiveInstallError, OSError) as exc:
        print(f"dbprovider upgrade check: {exc}", file=err)
        return EXIT_INVALID
    findings = run_checks(live)
    for finding in findings:
        print(finding.text(), file=out)
    counts = {severity: sum(1 for f in findings if f.severity == severity) for severity in (ERROR, WARNING, NOTICE)}
    print(
        f"dbprovider upgrade check ({__version__}): {counts[ERROR]} error(s), {counts[WARNING]} warning(s), "
        f"{counts[NOTICE]} notice(s)",
        file=err,
    )
    return EXIT_FINDINGS if counts[ERROR] else EXIT_OK
