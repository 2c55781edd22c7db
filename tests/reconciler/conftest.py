"""Fixtures of the reconciler suite: the rendered install on the real apiserver, real PostgreSQL
shards, and the controllers running as the provider's own ServiceAccount (so its RBAC is proven too).

Names start with `rectest` so they collide with no other suite on the shared apiserver; every
Shard and Database a test creates is removed when the test ends.
"""

from __future__ import annotations

import base64
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from domain.config import InstallConfig, load_install_config
from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, ANNOTATION_RESTORE_TENANT, FINALIZER_TENANT
from domain.naming import database_object_name
from harness import KubeControlPlane, PostgresServer
from harness.statement_log import LoggedStatement, parse_statement_log
from informers import SECRETS, Rest
from infra.render import render_manifests
from reconciler.resources import DATABASES, SHARDS
from tests.admin_secrets import AdminSecrets, shard_secrets
from tests.generator.kubeapi import KubeApi, apply_all, wait_for
from tests.in_process_manager import InProcessManager
from tests.k8s_objects import condition

NAMESPACE = "rectest-system"
RELEASE = "rectest"
# Shard admin Secrets live outside the release namespace, as docs/install.md recommends.
SHARD_SECRETS_NAMESPACE = "rectest-shards"
BASE_CONFIG: dict[str, Any] = {
    "releaseName": RELEASE,
    "namespace": NAMESPACE,
    "tls": {"secretName": "rectest-tls"},
    "shardSecrets": shard_secrets(RELEASE, SHARD_SECRETS_NAMESPACE),
    "sizeClasses": {"small": {"connectionLimit": 5}, "large": {"connectionLimit": 50}},
    "connectionLimit": {"default": 10},
    "deletionProtection": {"enabled": False},
    "softDelete": {"retention": "0"},
}


def install_config(**overrides: Any) -> InstallConfig:
    return load_install_config({**BASE_CONFIG, **overrides})


@pytest.fixture(scope="session")
def installed(kube: KubeControlPlane) -> KubeApi:
    """CRDs, RBAC and the rest of the install for release `rectest`, applied with server-side apply."""
    kube.ensure_namespace(NAMESPACE)
    kube.ensure_namespace(SHARD_SECRETS_NAMESPACE)
    api = KubeApi(kube.admin_client())
    apply_all(api, render_manifests(install_config()))
    return api


@pytest.fixture(scope="session")
def provider_client(kube: KubeControlPlane, installed: KubeApi) -> ApiClient:
    """A client authenticated as the provider's ServiceAccount (real TokenRequest token)."""
    return kube.service_account_client(NAMESPACE, RELEASE)


@pytest.fixture(scope="session")
def admin_rest(kube: KubeControlPlane, installed: KubeApi) -> Rest:
    return Rest(kube.admin_client())


@pytest.fixture
def start_manager(provider_client: ApiClient) -> Iterator[Callable[..., InProcessManager]]:
    started: list[InProcessManager] = []
    counter = itertools.count()

    def start(
        config: InstallConfig | None = None, wait_leading: bool = True, shard_ca_file: str | None = None
    ) -> InProcessManager:
        manager = InProcessManager(
            provider_client,
            config or install_config(),
            NAMESPACE,
            "rectest-manager",
            f"rectest-{next(counter)}",
            shard_ca_file,
        )
        started.append(manager.start(wait_leading))
        return manager

    yield start
    for manager in reversed(started):
        manager.stop()


class Fleet:
    """Creates Shards (with their admin Secrets, listed in shardSecrets) and Databases, and removes
    them all afterwards. Shards use TLS (sslmode require) unless a test asks otherwise."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.suffix = uuid.uuid4().hex[:6]
        self.shards: list[str] = []
        self.admin_secrets = AdminSecrets(rest, RELEASE, SHARD_SECRETS_NAMESPACE)
        self.databases: list[str] = []

    def shard(
        self,
        postgres: PostgresServer,
        *,
        name: str | None = None,
        max_databases: int = 50,
        accepting: bool = True,
        client_host: str = "pg.example.com",
        password: str | None = None,
        port: int | None = None,
        sslmode: str = "require",
        secret_ref: dict[str, str] | None = None,
    ) -> str:
        """`secret_ref` replaces the listed admin Secret the fleet writes (tests of unlisted ones)."""
        name = name or f"rectest-pg{postgres.major}-{self.suffix}-{len(self.shards)}"
        if secret_ref is None:
            user, secret = postgres.PROVISIONER, password if password is not None else postgres.provisioner_password
            secret_ref = {"namespace": SHARD_SECRETS_NAMESPACE, "name": self.admin_secrets.secret(user, secret)}
        body = {
            "apiVersion": "db.bnerd.com/v1alpha1",
            "kind": "Shard",
            "metadata": {"name": name},
            "spec": {
                "accepting": accepting,
                "maxDatabases": max_databases,
                "perconaCluster": {"namespace": "databases", "name": name},
                "admin": {
                    "serviceName": f"{name}-primary",
                    "port": port or postgres.port,
                    "sslmode": sslmode,
                    "secretRef": secret_ref,
                },
                "client": {"host": client_host, "port": 6432, "sslmode": "require"},
            },
        }
        self.rest.create(SHARDS, body)
        self.shards.append(name)
        return name

    def wait_shard(self, name: str, reason: str, timeout: float = 30) -> dict[str, Any]:
        """Wait until the Shard's Ready condition has `reason`; the Shard."""

        def probe() -> dict[str, Any] | None:
            shard = self.get_shard(name)
            ready = condition(shard, "Ready")
            return shard if ready is not None and ready["reason"] == reason else None

        return wait_for(probe, timeout=timeout, what=f"shard {name} to report {reason}")

    def admin_secret_of(self, shard: str) -> tuple[str, str]:
        """(name, namespace) of the Shard's admin Secret."""
        ref = self.get_shard(shard)["spec"]["admin"]["secretRef"]
        return ref["name"], ref["namespace"]

    def database(self, external_id: str, consumer: str = "rectest-consumer", size_class: str = "") -> str:
        name = database_object_name(consumer, external_id)
        body = {
            "apiVersion": "db.bnerd.com/v1alpha1",
            "kind": "Database",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"consumer": consumer, "externalId": external_id, "sizeClass": size_class},
        }
        self.rest.create(DATABASES, body, NAMESPACE)
        self.databases.append(name)
        return name

    def restore(self, name: str, consumer: str, external_id: str, shard: str, tenant: str) -> str:
        """A Database re-created by an operator on an existing tenant (the restore-tenant annotation)."""
        body = {
            "apiVersion": "db.bnerd.com/v1alpha1",
            "kind": "Database",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "annotations": {ANNOTATION_RESTORE_TENANT: f"{shard}/{tenant}"},
            },
            "spec": {"consumer": consumer, "externalId": external_id},
        }
        self.rest.create(DATABASES, body, NAMESPACE)
        self.databases.append(name)
        return name

    def get_database(self, name: str) -> dict[str, Any] | None:
        try:
            return self.rest.get(DATABASES, name, NAMESPACE)
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 404:
                return None
            raise

    def get_shard(self, name: str) -> dict[str, Any]:
        return self.rest.get(SHARDS, name)

    def wait_database(self, name: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60, what: str = ""):
        def probe() -> dict[str, Any] | None:
            db = self.get_database(name)
            return db if db is not None and check(db) else None

        return wait_for(probe, timeout=timeout, what=what or f"database {name}")

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait_database(
            name, lambda db: (db.get("status") or {}).get("phase") == phase, timeout, f"{name} to be {phase}"
        )

    def request_delete(self, name: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.rest.patch(
            DATABASES, name, {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: stamp}}}, NAMESPACE
        )

    def cleanup(self) -> None:
        for name in self.databases:
            try:
                self.rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
                self.rest.delete(DATABASES, name, NAMESPACE)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
            try:
                self.rest.delete(SECRETS, f"{name}-credentials", NAMESPACE)
            except Exception:  # noqa: BLE001, S110
                pass
        for name in self.shards:
            try:
                self.rest.delete(SHARDS, name)
            except Exception:  # noqa: BLE001, S110
                pass
        self.admin_secrets.cleanup()


@pytest.fixture
def fleet(admin_rest: Rest) -> Iterator[Fleet]:
    created = Fleet(admin_rest)
    yield created
    created.cleanup()


def secret_data(rest: Rest, name: str) -> dict[str, str]:
    secret = rest.get(SECRETS, name, NAMESPACE)
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


__all__ = ["FINALIZER_TENANT", "Fleet", "condition", "install_config", "secret_data"]


@pytest.fixture(scope="session")
def logged_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL 18 shard with log_statement=all: proves which SQL ran (or that none did)."""
    with PostgresServer("18", log_statements=True) as server:
        yield server


def provisioner_statements(server: PostgresServer) -> list[LoggedStatement]:
    """Every statement the provisioner role sent, in order: parameterized and multi-line ones too."""
    return parse_statement_log(server.statement_log(), server.PROVISIONER)


def is_shard_check(statement: LoggedStatement) -> bool:
    """The Shard controller's periodic health check (it reads the server version and its own role)."""
    return statement.keyword == "SELECT" and "current_setting('server_version_num')" in statement.text


def tenant_sql(statements: list[LoggedStatement]) -> list[LoggedStatement]:
    """What is left after the Shard controller's health checks: SQL about databases."""
    return [s for s in statements if not is_shard_check(s)]
