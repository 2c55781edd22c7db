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

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT
from domain.naming import database_object_name
from domain.resources import DATABASE_CLUSTERS, DATABASES
from harness import KubeControlPlane, PostgresServer
from harness.keldon import FAILED, KELDON_CRD, KELDON_CRD_NAME, NOT_RUNNING_PHASES, RUNNING  # noqa: F401 (re-exported to the tests)
from informers import EVENTS, LEASES, SECRETS, Resource, Rest
from tests.support.common import condition, wait_for
from tests.support.fleet import Fleet as BaseFleet
from tests.support.fleet import gone, ignore_missing
from tests.support.in_process_manager import InProcessManager
from tests.support.install import Release, release_fixtures
from tests.support.kubeapi import KubeApi, crd_established
from tests.support.postgres import drop_as_superuser

NAMESPACE = "cbtest-system"
KELDON_NAMESPACE = "cbtest-keldon"  # where the Keldon DatabaseClusters live (another namespace, as in production)
# Admin Secrets in the release namespace, listed: allowed (render warns); the reconciler suite
# keeps them in a namespace of their own, as recommended.
RELEASE = Release(
    "cbtest",
    NAMESPACE,
    NAMESPACE,
    {"engines": {"cloudberry": {"enabled": True}}, "sizeClasses": {"small": {"connectionLimit": 5}}},
)
install_config = RELEASE.config

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = Resource("", "v1", "namespaces")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles")
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings")


def _remove_namespace(rest: Rest, name: str) -> None:
    """Delete a namespace whose objects are gone. No namespace controller runs here: finalize it ourselves."""
    for resource in (SECRETS, EVENTS, LEASES, DATABASES, Resource("", "v1", "serviceaccounts")):
        with contextlib.suppress(ApiException):
            rest.request("DELETE", resource.collection_path(name))
    ignore_missing(lambda: rest.delete(NAMESPACES, name))
    with contextlib.suppress(ApiException):
        namespace = rest.get(NAMESPACES, name)
        namespace["spec"] = {"finalizers": []}
        rest.replace(NAMESPACES, namespace, subresource="finalize")
    wait_for(lambda: gone(rest, NAMESPACES, name), what=f"namespace {name} to go")


# -- Keldon clusters, shards and databases ------------------------------------------------------------


class Fleet(BaseFleet):
    """Plays the Keldon operator (DatabaseClusters and their phase) besides the platform engineer
    (Shards, admin Secrets) and the API (Databases); removes all of it, tenants on the server included."""

    release = RELEASE
    consumer = "cbtest-consumer"

    def __init__(self, rest: Rest) -> None:
        super().__init__(rest)
        self.clusters: list[str] = []
        self.servers: set[PostgresServer] = set()

    # -- Keldon --------------------------------------------------------------------------------

    def cluster(self, phase: str | None = RUNNING, *, name: str | None = None, segments: int = 2) -> str:
        """A DatabaseCluster; with a phase, its status is set as the operator would."""
        name = name or self.name("dbc")
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
        ignore_missing(lambda: self.rest.delete(DATABASE_CLUSTERS, cluster, KELDON_NAMESPACE))

    # -- Shards --------------------------------------------------------------------------------

    def cloudberry_shard(
        self,
        server: PostgresServer,
        cluster: str,
        *,
        name: str | None = None,
        max_databases: int = 50,
        client_host: str = "127.0.0.1",
    ) -> str:
        """A cloudberry Shard on `cluster`; the admin Service defaults to the cluster's client Service,
        the client endpoint is the server itself (by `client_host`)."""
        spec = {
            "engine": "cloudberry",
            "maxDatabases": max_databases,
            "keldonCluster": {"namespace": KELDON_NAMESPACE, "name": cluster},
            "admin": {"port": server.port, "sslmode": "require", "secretRef": self.admin_secret(server)},
            # The server itself: a new database is Ready only once its credentials log in there.
            "client": {"host": client_host, "port": server.port, "sslmode": "require"},
        }
        return self.create_shard(name or self.name("cb"), spec, server)

    def serving_shard(
        self, server: PostgresServer, start_manager: Callable[[], InProcessManager]
    ) -> tuple[str, str, InProcessManager]:
        """A Running cluster with a cloudberry Shard on `server`, the manager started and the Shard Ok:
        (cluster, shard, manager)."""
        cluster = self.cluster(RUNNING)
        shard = self.cloudberry_shard(server, cluster)
        manager = start_manager()
        self.wait_shard(shard, "Ok")
        return cluster, shard, manager

    def create_shard(self, name: str, spec: dict[str, Any], server: PostgresServer) -> str:
        self.servers.add(server)
        return super().create_shard(name, spec, server)

    # -- Databases -----------------------------------------------------------------------------

    def database(self, external_id: str, engine: str = "cloudberry", consumer: str | None = None) -> str:
        """A Database of engine `engine`; the external ID gets the fleet's suffix (the servers are shared)."""
        consumer = consumer or self.consumer
        external_id = f"{external_id}-{self.suffix}"
        spec = {"consumer": consumer, "externalId": external_id, "engine": engine}
        return self.create_database(database_object_name(consumer, external_id), spec)

    def wait_ready(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def ready(db: dict[str, Any]) -> bool:
            cond = condition(db, "Ready")
            return (db.get("status") or {}).get("phase") == "Ready" and cond is not None and cond["status"] == "True"

        return self.wait_database(name, ready, timeout, f"{name} to be Ready")

    def request_rotation(self, name: str) -> str:
        return self.annotate_now(name, ANNOTATION_ROTATE_REQUESTED_AT)

    # -- cleanup -------------------------------------------------------------------------------

    def cleanup(self) -> None:
        statuses = [(self.get_database(name) or {}).get("status") or {} for name in self.databases]
        tenants = [status["tenantName"] for status in statuses if status.get("tenantName")]
        super().cleanup()
        for name in self.clusters:
            self.delete_cluster(name)
        for server in self.servers:  # leave the shared servers as we found them
            drop_as_superuser(server, *tenants)


_plain_install, provider_client, admin_rest, start_manager, fleet = release_fixtures(RELEASE, Fleet)
del _plain_install  # replaced: this suite adds the Keldon CRD and removes its install at the end


@pytest.fixture(scope="session")
def installed(kube: KubeControlPlane) -> Iterator[KubeApi]:
    """The Keldon CRD, then the install of release `cbtest` (server-side apply); all removed at the end."""
    kube.ensure_namespace(KELDON_NAMESPACE)
    api = KubeApi(kube.admin_client())
    api.apply(KELDON_CRD)
    wait_for(lambda: crd_established(api, KELDON_CRD_NAME), what="the DatabaseCluster CRD")
    release_api = RELEASE.install(kube)
    yield release_api
    rest = Rest(kube.admin_client())
    for obj in RELEASE.manifests():  # the namespaced ones; the db.bnerd.com CRDs are shared with other suites
        if obj["metadata"].get("namespace") == NAMESPACE:
            api.delete(obj)
    ignore_missing(lambda: rest.delete(CLUSTER_ROLE_BINDINGS, RELEASE.name))
    ignore_missing(lambda: rest.delete(CLUSTER_ROLES, RELEASE.name))
    ignore_missing(lambda: rest.delete(CRDS, KELDON_CRD_NAME))  # the apiserver deletes leftover clusters
    wait_for(lambda: gone(rest, CRDS, KELDON_CRD_NAME), timeout=60, what="the DatabaseCluster CRD to go")
    _remove_namespace(rest, KELDON_NAMESPACE)
    _remove_namespace(rest, NAMESPACE)


@pytest.fixture(scope="session")
def pg15(postgres_pool) -> PostgresServer:
    """PostgreSQL 15: the pre-16 dialect Cloudberry 2.x (PostgreSQL 14 based) needs."""
    return postgres_pool.get("15")


_ids = itertools.count()


@contextlib.contextmanager
def running_manager(client: ApiClient) -> Iterator[InProcessManager]:
    """The controllers of one replica of release `cbtest`, in this process, for a `with` block."""
    manager = RELEASE.manager(client, f"cbtest-r{next(_ids)}").start()
    try:
        yield manager
    finally:
        manager.stop()


def tenant_connection(server: PostgresServer, creds: dict[str, str]) -> psycopg.Connection:
    """Connect with a Database's credentials (host and port replaced by the test server's)."""
    return server.connect(creds["user"], creds["password"], creds["database"])
