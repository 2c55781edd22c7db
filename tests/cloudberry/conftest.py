"""Fixtures of the Cloudberry suite: a Keldon DatabaseCluster CRD of our own, the rendered install with
`engines.cloudberry.enabled`, PostgreSQL 15 as the pre-16 stand-in for Cloudberry 2.x, and the
controllers running in-process as the provider's own ServiceAccount.

The Keldon operator cannot run here, so tests play its part: they create DatabaseClusters and drive
`status.phase` through the status subresource (the CRD is `harness.keldon`'s, shared with
`dbprovider dev`). Kubernetes object names start with `cbtest`; every cluster-scoped object the
suite creates (Shards, the Keldon CRD, the install's ClusterRole and binding, the namespaces) is
removed again, Shards at the end of each test, the rest at the end of the session.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from psycopg import sql

from domain.config import InstallConfig, load_install_config
from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT
from domain.naming import database_object_name
from harness import KubeControlPlane, PostgresServer
from harness.keldon import FAILED, KELDON_CRD, KELDON_CRD_NAME, NOT_RUNNING_PHASES, RUNNING  # noqa: F401 (re-exported to the tests)
from informers import EVENTS, LEASES, SECRETS, Resource, Rest
from infra.render import render_manifests
from reconciler.resources import DATABASE_CLUSTERS, DATABASES, SHARDS
from tests.admin_secrets import AdminSecrets, shard_secrets
from tests.generator.kubeapi import KubeApi, apply_all, crd_established, wait_for
from tests.in_process_manager import InProcessManager
from tests.k8s_objects import condition

NAMESPACE = "cbtest-system"
KELDON_NAMESPACE = "cbtest-keldon"  # where the Keldon DatabaseClusters live (another namespace, as in production)
RELEASE = "cbtest"
BASE_CONFIG: dict[str, Any] = {
    "releaseName": RELEASE,
    "namespace": NAMESPACE,
    "tls": {"secretName": "cbtest-tls"},
    # Admin Secrets in the release namespace, listed: allowed (render warns); the reconciler suite
    # keeps them in a namespace of their own, as recommended.
    "shardSecrets": shard_secrets(RELEASE, NAMESPACE),
    "engines": {"cloudberry": {"enabled": True}},
    "sizeClasses": {"small": {"connectionLimit": 5}},
    "connectionLimit": {"default": 10},
    "deletionProtection": {"enabled": False},
    "softDelete": {"retention": "0"},
}

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = Resource("", "v1", "namespaces")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles")
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings")


def install_config(**overrides: Any) -> InstallConfig:
    return load_install_config({**BASE_CONFIG, **overrides})


def _ignore_missing(call: Callable[[], Any]) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def _gone(rest: Rest, resource: Resource, name: str, namespace: str | None = None) -> bool:
    try:
        rest.get(resource, name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def _remove_namespace(rest: Rest, name: str) -> None:
    """Delete a namespace whose objects are gone. No namespace controller runs here: finalize it ourselves."""
    for resource in (SECRETS, EVENTS, LEASES, DATABASES, Resource("", "v1", "serviceaccounts")):
        with contextlib.suppress(ApiException):
            rest.request("DELETE", resource.collection_path(name))
    _ignore_missing(lambda: rest.delete(NAMESPACES, name))
    with contextlib.suppress(ApiException):
        namespace = rest.get(NAMESPACES, name)
        namespace["spec"] = {"finalizers": []}
        rest.replace(NAMESPACES, namespace, subresource="finalize")
    wait_for(lambda: _gone(rest, NAMESPACES, name), what=f"namespace {name} to go")


@pytest.fixture(scope="session")
def installed(kube: KubeControlPlane) -> Iterator[KubeApi]:
    """The Keldon CRD, then the install of release `cbtest` (server-side apply); all removed at the end."""
    kube.ensure_namespace(NAMESPACE)
    kube.ensure_namespace(KELDON_NAMESPACE)
    api = KubeApi(kube.admin_client())
    api.apply(KELDON_CRD)
    wait_for(lambda: crd_established(api, KELDON_CRD_NAME), what="the DatabaseCluster CRD")
    manifests = render_manifests(install_config())
    apply_all(api, manifests)
    yield api
    rest = Rest(kube.admin_client())
    for obj in manifests:  # the namespaced ones; the db.bnerd.com CRDs are shared with other suites
        if obj["metadata"].get("namespace") == NAMESPACE:
            api.delete(obj)
    _ignore_missing(lambda: rest.delete(CLUSTER_ROLE_BINDINGS, RELEASE))
    _ignore_missing(lambda: rest.delete(CLUSTER_ROLES, RELEASE))
    _ignore_missing(lambda: rest.delete(CRDS, KELDON_CRD_NAME))  # the apiserver deletes leftover clusters
    wait_for(lambda: _gone(rest, CRDS, KELDON_CRD_NAME), timeout=60, what="the DatabaseCluster CRD to go")
    _remove_namespace(rest, KELDON_NAMESPACE)
    _remove_namespace(rest, NAMESPACE)


@pytest.fixture(scope="session")
def provider_client(kube: KubeControlPlane, installed: KubeApi) -> ApiClient:
    """A client authenticated as the provider's ServiceAccount (real TokenRequest token)."""
    return kube.service_account_client(NAMESPACE, RELEASE)


@pytest.fixture(scope="session")
def admin_rest(kube: KubeControlPlane, installed: KubeApi) -> Rest:
    return Rest(kube.admin_client())


@pytest.fixture(scope="session")
def pg15(postgres_pool) -> PostgresServer:
    """PostgreSQL 15: the pre-16 dialect Cloudberry 2.x (PostgreSQL 14 based) needs."""
    return postgres_pool.get("15")


# -- the manager -------------------------------------------------------------------------------------


_ids = itertools.count()


def new_manager(client: ApiClient, config: InstallConfig | None = None) -> InProcessManager:
    """The controllers of one replica of release `cbtest`, in this process."""
    return InProcessManager(client, config or install_config(), NAMESPACE, "cbtest-manager", f"cbtest-{next(_ids)}")


@contextlib.contextmanager
def running_manager(client: ApiClient) -> Iterator[InProcessManager]:
    manager = new_manager(client).start()
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture
def start_manager(provider_client: ApiClient) -> Iterator[Callable[[], InProcessManager]]:
    started: list[InProcessManager] = []

    def start() -> InProcessManager:
        manager = new_manager(provider_client).start()
        started.append(manager)
        return manager

    yield start
    for manager in reversed(started):
        manager.stop()


# -- Keldon clusters, shards and databases ------------------------------------------------------------


class Fleet:
    """Plays the Keldon operator (DatabaseClusters and their phase) and the platform engineer (Shards,
    admin Secrets) and the API (Databases); removes all of it, tenants on the server included."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.suffix = uuid.uuid4().hex[:6]
        self.counter = itertools.count()
        self.clusters: list[str] = []
        self.shards: list[str] = []
        self.admin_secrets = AdminSecrets(rest, RELEASE, NAMESPACE)
        self.databases: list[str] = []
        self.servers: set[PostgresServer] = set()

    def _name(self, kind: str) -> str:
        return f"cbtest-{kind}-{self.suffix}-{next(self.counter)}"

    # -- Keldon --------------------------------------------------------------------------------

    def cluster(self, phase: str | None = RUNNING, *, name: str | None = None, segments: int = 2) -> str:
        """A DatabaseCluster; with a phase, its status is set as the operator would."""
        name = name or self._name("dbc")
        body = {
            "apiVersion": "keldon.io/v1alpha1",
            "kind": "DatabaseCluster",
            "metadata": {"name": name, "namespace": KELDON_NAMESPACE},
            "spec": {"segments": {"count": segments}, "standby": {"enabled": True}},
        }
        self.rest.create(DATABASE_CLUSTERS, body, KELDON_NAMESPACE)
        self.clusters.append(name)
        if phase is not None:
            self.set_phase(name, phase)
        return name

    def set_phase(self, cluster: str, phase: str) -> None:
        self.rest.patch(
            DATABASE_CLUSTERS, cluster, {"status": {"phase": phase}}, KELDON_NAMESPACE, subresource="status"
        )

    def scale(self, cluster: str, segments: int) -> None:
        self.rest.patch(DATABASE_CLUSTERS, cluster, {"spec": {"segments": {"count": segments}}}, KELDON_NAMESPACE)

    def delete_cluster(self, cluster: str) -> None:
        _ignore_missing(lambda: self.rest.delete(DATABASE_CLUSTERS, cluster, KELDON_NAMESPACE))

    # -- Shards --------------------------------------------------------------------------------

    def _admin_secret(self, server: PostgresServer) -> str:
        return self.admin_secrets.secret(server.PROVISIONER, server.provisioner_password)

    def cloudberry_shard(
        self, server: PostgresServer, cluster: str, *, name: str | None = None, max_databases: int = 50
    ) -> str:
        """A cloudberry Shard on `cluster`; the admin Service defaults to the cluster's client Service."""
        name = name or self._name("cb")
        spec = {
            "engine": "cloudberry",
            "maxDatabases": max_databases,
            "keldonCluster": {"namespace": KELDON_NAMESPACE, "name": cluster},
            "admin": {
                "port": server.port,
                "sslmode": "require",
                "secretRef": {"namespace": NAMESPACE, "name": self._admin_secret(server)},
            },
            "client": {"host": f"{cluster}.analytics.example.com", "port": 5432, "sslmode": "require"},
        }
        return self._shard(name, spec, server)

    def postgres_shard(self, server: PostgresServer, *, name: str | None = None, max_databases: int = 50) -> str:
        name = name or self._name("pg")
        spec = {
            "maxDatabases": max_databases,
            "perconaCluster": {"namespace": "databases", "name": name},
            "admin": {
                "serviceName": f"{name}-primary",
                "port": server.port,
                "sslmode": "require",
                "secretRef": {"namespace": NAMESPACE, "name": self._admin_secret(server)},
            },
            "client": {"host": "pg.example.com", "port": 6432, "sslmode": "require"},
        }
        return self._shard(name, spec, server)

    def _shard(self, name: str, spec: dict[str, Any], server: PostgresServer) -> str:
        body = {"apiVersion": "db.bnerd.com/v1alpha1", "kind": "Shard", "metadata": {"name": name}, "spec": spec}
        self.rest.create(SHARDS, body)
        self.shards.append(name)
        self.servers.add(server)
        return name

    def get_shard(self, name: str) -> dict[str, Any]:
        return self.rest.get(SHARDS, name)

    def wait_shard(self, name: str, reason: str, message: str = "", timeout: float = 30) -> dict[str, Any]:
        """Wait until the Shard's Ready condition has `reason` (Ok means Ready=True) and a message
        containing `message`."""

        def probe() -> dict[str, Any] | None:
            shard = self.get_shard(name)
            ready = condition(shard, "Ready")
            if ready is None or ready["reason"] != reason or message not in ready.get("message", ""):
                return None
            return shard

        return wait_for(probe, timeout=timeout, what=f"shard {name} to report {reason} {message!r}")

    # -- Databases -----------------------------------------------------------------------------

    def database(self, external_id: str, engine: str = "cloudberry", consumer: str = "cbtest-consumer") -> str:
        name = database_object_name(consumer, f"{external_id}-{self.suffix}")
        body = {
            "apiVersion": "db.bnerd.com/v1alpha1",
            "kind": "Database",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"consumer": consumer, "externalId": f"{external_id}-{self.suffix}", "engine": engine},
        }
        self.rest.create(DATABASES, body, NAMESPACE)
        self.databases.append(name)
        return name

    def get_database(self, name: str) -> dict[str, Any]:
        return self.rest.get(DATABASES, name, NAMESPACE)

    def wait_database(
        self, name: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        return wait_for(lambda: (db := self.get_database(name)) and check(db) and db, timeout=timeout, what=what)

    def wait_ready(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def ready(db: dict[str, Any]) -> bool:
            cond = condition(db, "Ready")
            return (db.get("status") or {}).get("phase") == "Ready" and cond is not None and cond["status"] == "True"

        return self.wait_database(name, ready, f"{name} to be Ready", timeout)

    def wait_reason(self, name: str, phase: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        def matches(db: dict[str, Any]) -> bool:
            cond = condition(db, "Ready")
            return (db.get("status") or {}).get("phase") == phase and cond is not None and cond["reason"] == reason

        return self.wait_database(name, matches, f"{name} to be {phase}/{reason}", timeout)

    def request_rotation(self, name: str) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.rest.patch(
            DATABASES, name, {"metadata": {"annotations": {ANNOTATION_ROTATE_REQUESTED_AT: stamp}}}, NAMESPACE
        )
        return stamp

    def credentials(self, name: str) -> dict[str, str]:
        secret = self.rest.get(SECRETS, f"{name}-credentials", NAMESPACE)
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    # -- cleanup -------------------------------------------------------------------------------

    def cleanup(self) -> None:
        tenants: list[str] = []
        for name in self.databases:
            with contextlib.suppress(ApiException):
                tenant = (self.get_database(name).get("status") or {}).get("tenantName")
                if tenant:
                    tenants.append(tenant)
            with contextlib.suppress(ApiException):
                self.rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
                self.rest.delete(DATABASES, name, NAMESPACE)
            _ignore_missing(lambda name=name: self.rest.delete(SECRETS, f"{name}-credentials", NAMESPACE))
        for name in self.shards:
            _ignore_missing(lambda name=name: self.rest.delete(SHARDS, name))
        self.admin_secrets.cleanup()
        for name in self.clusters:
            self.delete_cluster(name)
        for server in self.servers:  # leave the shared servers as we found them
            drop_tenants(server, tenants)


def drop_tenants(server: PostgresServer, tenants: list[str]) -> None:
    with server.superuser_connection() as su:
        for tenant in tenants:
            su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(tenant)))
            su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(tenant)))


@pytest.fixture
def fleet(admin_rest: Rest) -> Iterator[Fleet]:
    created = Fleet(admin_rest)
    yield created
    created.cleanup()


def tenant_connection(server: PostgresServer, creds: dict[str, str]) -> psycopg.Connection:
    """Connect with a Database's credentials (host and port replaced by the test server's)."""
    return server.connect(creds["user"], creds["password"], creds["database"])
