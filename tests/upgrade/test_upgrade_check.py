"""`dbprovider upgrade check` on a live install of the previous release: each rule, and nothing changed.

The install is the previous release's own render (its RBAC, ConfigMap and Deployment, on the shared
apiserver's CRDs). Shards, Databases and tenants are made as that release leaves them, with one
problem each; the check runs as a user who may only read, with --shard-sql against real PostgreSQL
(15, 16, 18) and a server that offers only md5. Nothing may change: no object, no tenant, and the
md5 server never sees a password.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from psycopg import sql

from dbprovider.kubeapply import Applier
from domain.constants import API_VERSION
from domain.naming import tenant_name
from domain.resources import DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from harness.releases import REPO, BuiltRelease
from informers import SECRETS, Rest
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import OwnerRecord, TenantSpec, ensure_tenant
from tests.reconciler.hostile_postgres import MD5, HostilePostgres
from tests.sql.helpers import admin_endpoint
from tests.support.common import b64, shard_object, unique
from tests.support.install import release_config
from tests.support.postgres import drop_as_superuser, role_comment
from tests.upgrade.stack import built_release, this_checkout

RELEASE, NAMESPACE, SECRETS_NS = "upgcheck", "upgcheck-system", "upgcheck-shards"
READER = "upgcheck-reader"
NOW = "2026-12-01T10:00:00Z"


def _condition(reason: str, message: str) -> dict[str, Any]:
    status = "True" if reason == "Ok" else "False"
    return {"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": NOW}


@pytest.fixture(scope="module")
def installed(kube: KubeControlPlane, previous: BuiltRelease, tmp_path_factory: pytest.TempPathFactory) -> Rest:
    """The previous release's install (without its CRDs: the shared apiserver's serve both) and a
    ClusterRole that may only read, bound to READER."""
    for namespace in (NAMESPACE, SECRETS_NS):
        kube.ensure_namespace(namespace)
    values = tmp_path_factory.mktemp("upgcheck") / "values.yaml"
    config = release_config(RELEASE, NAMESPACE, shardSecrets=[{"namespace": SECRETS_NS, "name": "listed"}])
    values.write_text(yaml.safe_dump(config))
    manifests = built_release(previous).render(values)
    rest = Rest(kube.admin_client())
    applier = Applier(rest)
    applier.apply_all([m for m in manifests if m["kind"] != "CustomResourceDefinition"])
    current = this_checkout("current").render(values)  # the CRDs as the other suites install them
    applier.apply_all([m for m in current if m["kind"] == "CustomResourceDefinition"])
    applier.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": READER},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
        }
    )
    applier.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": READER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": READER}],
        }
    )
    return rest


class Setup:
    """The objects of one test, removed afterwards."""

    def __init__(self, rest: Rest, postgres: PostgresServer) -> None:
        self.rest, self.postgres = rest, postgres
        self.suffix = unique("x")[-6:]
        self.shards: list[str] = []
        self.databases: list[str] = []
        self.tenants: list[str] = []
        self.secrets: list[str] = []

    def secret(self, name: str, server_user: str, password: str, **extra: str) -> None:
        metadata = {"name": name, "namespace": SECRETS_NS}
        data = {"user": b64(server_user), "password": b64(password), **{k: b64(v) for k, v in extra.items()}}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}
        self.rest.create(SECRETS, body, SECRETS_NS)
        self.secrets.append(name)

    def shard(self, name: str, port: int, secret: str, sslmode: str, ready: dict[str, Any]) -> str:
        name = f"{name}-{self.suffix}"
        spec = {
            "maxDatabases": 10,
            "perconaCluster": {"namespace": NAMESPACE, "name": name},
            "admin": {
                "serviceName": "pg",
                "port": port,
                "sslmode": sslmode,
                "secretRef": {"namespace": SECRETS_NS, "name": secret},
            },
            "client": {"host": "127.0.0.1", "port": port},
        }
        self.rest.create(SHARDS, shard_object(name, spec))
        self.rest.patch(SHARDS, name, {"status": {"conditions": [ready]}}, subresource="status")
        self.shards.append(name)
        return name

    def database(self, external_id: str, shard: str, phase: str, limit: int = 10) -> tuple[str, str, OwnerRecord]:
        """A Database placed on `shard` as the previous release leaves it: (name, tenant, its record)."""
        name = f"{external_id}-{self.suffix}"
        db = self.rest.create(
            DATABASES,
            {
                "apiVersion": API_VERSION,
                "kind": "Database",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"consumer": "team", "externalId": external_id},
            },
            NAMESPACE,
        )
        tenant = tenant_name(external_id, db["metadata"]["uid"])
        self.rest.patch(
            DATABASES,
            name,
            {"status": {"phase": phase, "shard": shard, "tenantName": tenant, "appliedConnectionLimit": limit}},
            NAMESPACE,
            subresource="status",
        )
        self.databases.append(name)
        self.tenants.append(tenant)
        return name, tenant, OwnerRecord("team", db["metadata"]["uid"])

    def cleanup(self) -> None:
        for name in self.databases:
            try:
                self.rest.delete(DATABASES, name, NAMESPACE)
            except ApiException:
                pass
        for name in self.shards:
            self.rest.delete(SHARDS, name)
        for name in self.secrets:
            self.rest.delete(SECRETS, name, SECRETS_NS)
        drop_as_superuser(self.postgres, *self.tenants)


@pytest.fixture
def setup(installed: Rest, postgres: PostgresServer) -> Iterator[Setup]:
    made = Setup(installed, postgres)
    yield made
    made.cleanup()


def _run_upgrade_check(
    kubeconfig: Path, *args: str, release: str = RELEASE, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`dbprovider upgrade check` as the platform engineer runs it, with the reader's kubeconfig."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dbprovider.cli",
            "upgrade",
            "check",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            NAMESPACE,
            "--release",
            release,
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def _check(kube: KubeControlPlane, tmp_path: Path, *args: str) -> tuple[int, list[tuple[str, str, str]], str]:
    kubeconfig = kube.write_kubeconfig(tmp_path / "reader.kubeconfig", user=READER)
    out = _run_upgrade_check(kubeconfig, *args)
    findings = []
    for line in out.stdout.splitlines():
        severity, obj, rest = line.split(": ", 2)
        findings.append((severity, rest.rsplit("[", 1)[1].rstrip("]"), obj))
    return out.returncode, findings, out.stdout


def _resource_versions(rest: Rest) -> dict[str, str]:
    seen = {}
    for resource, namespace in ((SHARDS, None), (DATABASES, NAMESPACE)):
        for obj in rest.list(resource, namespace)["items"]:
            seen[f"{resource.plural}/{obj['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
    return seen


def test_every_rule_reports_what_this_release_refuses_and_nothing_changes(
    kube: KubeControlPlane, setup: Setup, postgres: PostgresServer, tmp_path: Path
) -> None:
    rest = setup.rest
    setup.secret("listed", postgres.PROVISIONER, postgres.provisioner_password)
    setup.secret(f"unlisted-{setup.suffix}", postgres.PROVISIONER, postgres.provisioner_password)
    good = setup.shard("good", postgres.port, "listed", "require", _condition("Ok", "admin connection healthy"))
    unlisted = setup.shard(
        "unlisted", postgres.port, f"unlisted-{setup.suffix}", "require", _condition("AdminSecretInvalid", "not listed")
    )
    plain = setup.shard("plain", postgres.port, "listed", "disable", _condition("Ok", "admin connection healthy"))
    # An admin Secret bound to another endpoint (Percona's pguser Secrets name their host and port).
    setup.secret(
        f"bound-{setup.suffix}",
        postgres.PROVISIONER,
        postgres.provisioner_password,
        host="pg-elsewhere.shards.svc",
        port=str(postgres.port),
    )
    bound = setup.shard("bound", postgres.port, f"bound-{setup.suffix}", "require", _condition("Ok", "healthy"))
    # A shard whose databases commit more connections than its budget.
    full = setup.shard("full", postgres.port, "listed", "require", _condition("Ok", "healthy"))
    setup.database("huge", full, "Ready", limit=100_000)
    with HostilePostgres(MD5) as md5_server:
        md5 = setup.shard(
            "md5",
            md5_server.port,
            "listed",
            "prefer",
            _condition("AdminAuthFailed", "admin login failed: insecure_auth_refused"),
        )

        # Tenants as the previous release left them (and as builds before ownership records did).
        recorded, recorded_t, recorded_owner = setup.database("recorded", good, "Ready")
        legacy, legacy_t, _ = setup.database("legacy", good, "Ready")
        foreign, foreign_t, _ = setup.database("foreign", good, "Ready")
        taken, taken_t, _ = setup.database("taken", good, "Provisioning")
        with AdminSession.for_endpoint(admin_endpoint(postgres)) as admin:
            ensure_tenant(admin, TenantSpec(recorded_t, "pw-recorded", 10, recorded_owner))
            ensure_tenant(admin, TenantSpec(legacy_t, "pw-legacy", 10))
            ensure_tenant(admin, TenantSpec(foreign_t, "pw-foreign", 10))
        with postgres.superuser_connection() as su:
            su.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(foreign_t)))
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(taken_t)))
        before = _resource_versions(rest)

        values = tmp_path / "values.yaml"  # the upgrade's values list the bound Secret too
        listed = [{"namespace": SECRETS_NS, "name": name} for name in ("listed", f"bound-{setup.suffix}")]
        values.write_text(yaml.safe_dump(release_config(RELEASE, NAMESPACE, shardSecrets=listed)))
        code, findings, text = _check(
            kube, tmp_path, "--shard-sql", "--admin-host-override", "127.0.0.1", "--config", str(values)
        )
        # sslmode prefer may go without TLS: this release opens no connection there at all (admin-tls).
        assert not md5_server.startups, "the check connected to a shard this release refuses"

    expected = {
        ("error", "admin-secret-listed", f"Shard/{unlisted}"),
        ("error", "admin-tls", f"Shard/{plain}"),
        ("error", "admin-tls", f"Shard/{md5}"),
        ("error", "admin-scram", f"Shard/{md5}"),
        ("error", "admin-endpoint", f"Shard/{bound}"),
        ("warning", "connection-budget", f"Shard/{full}"),
        ("notice", "tenant-ownership", f"Database/{NAMESPACE}/{legacy}"),
        ("warning", "tenant-ownership", f"Database/{NAMESPACE}/{foreign}"),
        ("error", "tenant-ownership", f"Database/{NAMESPACE}/{taken}"),  # 15: unprovable; 16+: no ADMIN
    }
    mine = {f for f in findings if f[2].endswith(setup.suffix) or f[2] == "install"}
    assert expected <= mine, text
    assert not {f for f in mine - expected if f[0] != "notice" or f[1] != "tenant-ownership"} - {
        ("warning", "tenant-ownership", f"Shard/{plain}"),  # sslmode disable: this server takes TLS only
        ("warning", "tenant-ownership", f"Shard/{unlisted}"),  # its Secret is not listed: never read
        ("warning", "tenant-ownership", f"Database/{NAMESPACE}/huge-{setup.suffix}"),  # no tenant made for it
    }, text
    assert f"Database/{NAMESPACE}/{recorded}" not in {f[2] for f in findings}
    assert code == 1
    # It changed nothing: no object, no tenant record.
    assert _resource_versions(rest) == before
    assert role_comment(postgres, legacy_t) is None and role_comment(postgres, taken_t) is None


def test_without_shard_sql_it_says_what_it_did_not_check_and_values_given_are_used(
    kube: KubeControlPlane, setup: Setup, postgres: PostgresServer, tmp_path: Path
) -> None:
    setup.secret(f"unlisted-{setup.suffix}", postgres.PROVISIONER, postgres.provisioner_password)
    unlisted = setup.shard(
        "unlisted", postgres.port, f"unlisted-{setup.suffix}", "require", _condition("AdminSecretInvalid", "not listed")
    )
    code, findings, text = _check(kube, tmp_path)
    assert ("notice", "tenant-ownership", "install") in findings
    assert ("error", "admin-secret-listed", f"Shard/{unlisted}") in findings
    assert code == 1

    # The values the upgrade will use list the Secret: that finding is gone.
    values = tmp_path / "values.yaml"
    listed = [{"namespace": SECRETS_NS, "name": name} for name in ("listed", f"unlisted-{setup.suffix}")]
    values.write_text(yaml.safe_dump(release_config(RELEASE, NAMESPACE, shardSecrets=listed)))
    code, findings, text = _check(kube, tmp_path, "--config", str(values))
    assert ("error", "admin-secret-listed", f"Shard/{unlisted}") not in findings, text


def test_a_wrong_release_or_an_unreachable_cluster_is_bad_input(
    kube: KubeControlPlane, installed: Rest, tmp_path: Path
) -> None:
    kubeconfig = kube.write_kubeconfig(tmp_path / "reader.kubeconfig", user=READER)
    out = _run_upgrade_check(kubeconfig, release="nosuch", timeout=60)
    assert out.returncode == 2 and "no ConfigMap nosuch-config" in out.stderr
    broken = tmp_path / "broken.kubeconfig"
    broken.write_text(kubeconfig.read_text().replace(kube.url, "https://127.0.0.1:9"))
    out = _run_upgrade_check(broken)
    assert out.returncode == 2 and "cannot read the cluster" in out.stderr


def test_the_installed_release_decides_the_path(installed: Rest) -> None:
    """0.1.0 labelled nothing: read as 0.1.0; a newer release installed is a rollback; older ones must step."""
    from dbprovider.upgrade_check import _release_path
    from dbprovider.upgrade_facts import LiveInstall

    def live(label: str | None) -> LiveInstall:
        labels = {} if label is None else {"app.kubernetes.io/version": label}
        deployment = {"metadata": {"labels": labels}}
        return LiveInstall(NAMESPACE, RELEASE, None, [], "", deployment, {}, {}, [], {})

    assert list(_release_path(live(None))) == []
    assert [f[0] for f in _release_path(live("9.0.0"))] == ["error"]
    assert [f[0] for f in _release_path(live("0.0.1"))] == ["error"]


def test_a_shard_named_in_cleartext_shards_may_keep_a_mode_without_tls(
    kube: KubeControlPlane, setup: Setup, postgres: PostgresServer, tmp_path: Path
) -> None:
    setup.secret("listed", postgres.PROVISIONER, postgres.provisioner_password)
    plain = setup.shard("plain", postgres.port, "listed", "disable", _condition("Ok", "admin connection healthy"))
    code, findings, text = _check(kube, tmp_path)
    assert ("error", "admin-tls", f"Shard/{plain}") in findings, text
    values = tmp_path / "values.yaml"
    config = release_config(
        RELEASE,
        NAMESPACE,
        shardSecrets=[{"namespace": SECRETS_NS, "name": "listed"}],
        shardTLS={"cleartextShards": [plain]},
    )
    values.write_text(yaml.safe_dump(config))
    code, findings, text = _check(kube, tmp_path, "--config", str(values))
    assert ("error", "admin-tls", f"Shard/{plain}") not in findings, text


def test_an_admin_secret_bound_to_no_endpoint_is_a_warning(
    kube: KubeControlPlane, setup: Setup, postgres: PostgresServer, tmp_path: Path
) -> None:
    unbound, own_keys, by_entry, missing = (f"{n}-{setup.suffix}" for n in ("unbound", "own-keys", "entry", "missing"))
    setup.secret(unbound, postgres.PROVISIONER, postgres.provisioner_password)
    setup.secret(own_keys, postgres.PROVISIONER, postgres.provisioner_password, host="pg.shards.svc", port="5432")
    setup.secret(by_entry, postgres.PROVISIONER, postgres.provisioner_password)
    values = tmp_path / "values.yaml"
    listed = [
        {"namespace": SECRETS_NS, "name": unbound},
        {"namespace": SECRETS_NS, "name": own_keys},
        {"namespace": SECRETS_NS, "name": by_entry, "host": "pg.shards.svc", "port": 5432},
        {"namespace": SECRETS_NS, "name": missing},
    ]
    values.write_text(yaml.safe_dump(release_config(RELEASE, NAMESPACE, shardSecrets=listed)))
    code, findings, text = _check(kube, tmp_path, "--config", str(values))
    mine = {f for f in findings if f[1] == "admin-secret-bound"}
    assert mine == {
        ("warning", "admin-secret-bound", f"Secret/{SECRETS_NS}/{unbound}"),
        ("notice", "admin-secret-bound", f"Secret/{SECRETS_NS}/{missing}"),
    }, text
    assert "set host and port on its shardSecrets entry" in text
    assert postgres.provisioner_password not in text
