"""The whole product on one machine: what `dbprovider dev` runs and the end-to-end tests start.

Given a running control plane and PostgreSQL server or Patroni cluster (harness), `DevStack.install()`
applies the rendered install (CRDs, RBAC, admission policy, ...), registers it as a Shard (TLS on, its
admin Secret in a namespace of its own and listed in shardSecrets, as docs/install.md asks; its
maxDatabases what `dev_shard_capacity` says the server holds; a Patroni cluster's admin endpoint is its
primary endpoint and its client endpoint pgBouncer, declared as the Shard's pooler), creates a
Consumer with a fresh bearer token, issues the API's TLS certificate and writes the files the
manager needs: its install config and a kubeconfig with a real token of its ServiceAccount.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbprovider.dev_values import DEV_CONFIG, dev_install_config, merge_values
from dbprovider.kubeapply import Applier
from domain.config import InstallConfig
from domain.connection_budget import UNLIMITED, ServerSlots, budget, provider_sessions
from domain.constants import (
    API_VERSION,
    DEFAULT_TOKEN_KEY,
    KELDON_GROUP,
    KELDON_KIND_DATABASE_CLUSTER,
    KELDON_VERSION,
    KIND_CONSUMER,
    KIND_SHARD,
    Engine,
)
from domain.credentials import opaque_secret
from domain.resources import CONSUMERS, SHARDS
from domain.settings import SETTINGS
from domain.tokens import hash_token
from harness import KubeControlPlane, PostgresServer
from harness.certs import CertificateAuthority
from harness.keldon import KELDON_CRD
from harness.patroni import POOLER_AUTH_USER, PatroniShard
from harness.process import free_port
from informers import SECRETS, Rest
from infra.render import config_yaml, dump_yaml, render_manifests

DEV_SHARD = "local-pg"
DEV_MAX_DATABASES = 100
# The least and the most max_connections dev starts its PostgreSQL with.
DEV_MAX_CONNECTIONS = (200, 2000)
SUPERUSER_RESERVED = 3  # PostgreSQL's default superuser_reserved_connections


def dev_shard_capacity(config: InstallConfig, shard: str = DEV_SHARD) -> tuple[int, int]:
    """(max_connections for dev's PostgreSQL, maxDatabases of its Shard) that agree: the shard's connection
    budget holds maxDatabases databases of the default connection limit. 100 databases where the server
    may have the connections they need (at most 2000), fewer where a large default limit would need more."""
    limit = config.connection_limit.default
    low, high = DEV_MAX_CONNECTIONS
    if limit == UNLIMITED:
        return low, 1  # one such database takes the whole budget
    if limit == 0:
        return low, DEV_MAX_DATABASES
    provider = provider_sessions(config.workers_per_shard)
    reserved = config.connection_budget.reserved
    ratio = config.connection_budget.overcommit_of(shard)
    need = SUPERUSER_RESERVED + provider + reserved + math.ceil(DEV_MAX_DATABASES * limit / ratio)
    max_connections = min(max(need, low), high)
    shard_budget = budget(ServerSlots(max_connections, SUPERUSER_RESERVED), provider, reserved, ratio)
    return max_connections, max(1, min(DEV_MAX_DATABASES, shard_budget // limit))


@dataclass
class DevStack:
    kube: KubeControlPlane
    postgres: PostgresServer | PatroniShard
    state_dir: Path
    config_overrides: dict[str, Any] = field(default_factory=dict)
    consumer: str = "dev-consumer"
    shard: str = DEV_SHARD
    max_databases: int = DEV_MAX_DATABASES  # dev_shard_capacity's, for a server started with its max_connections

    def __post_init__(self) -> None:
        self.admin_secret = f"{self.shard}-provisioner"
        self.shard_secrets_namespace = f"{merge_values(DEV_CONFIG, self.config_overrides).get('namespace')}-shards"
        self.config: InstallConfig = dev_install_config(self._with_own_admin_secret(self.config_overrides))
        self.namespace = self.config.namespace
        self.token = secrets.token_hex(32)
        self.api_port = free_port()
        self.metrics_port = free_port()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_file = self.state_dir / "config.yaml"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.manager_kubeconfig = self.state_dir / "manager.kubeconfig"
        self.cloudberry_example = self.state_dir / "cloudberry-example.yaml"

    def _with_own_admin_secret(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Add the local shard's admin Secret to shardSecrets (the provider reads only listed ones)."""
        listed = merge_values(DEV_CONFIG, overrides).get("shardSecrets") or []
        own = {"namespace": self.shard_secrets_namespace, "name": self.admin_secret}
        if not isinstance(listed, list) or own in listed:
            return overrides
        return merge_values(overrides, {"shardSecrets": [*listed, own]})

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def install(self) -> DevStack:
        kube = self.kube
        kube.ensure_namespace(self.namespace)
        for namespace in self.config.shard_secrets_by_namespace():  # dev's own and the user's: their Roles
            kube.ensure_namespace(namespace)
        # Keldon cannot run here; its CRD lets a user declare DatabaseClusters and play the operator.
        extra_crds = [KELDON_CRD] if self.config.engines.cloudberry.enabled else []
        with kube.admin_client() as client:
            rest = Rest(client)
            Applier(rest).apply_all([*extra_crds, *render_manifests(self.config)])
            self._tls(rest)
            self._shard(rest)
            self._consumer(rest)
        if self.config.engines.cloudberry.enabled:
            self.cloudberry_example.write_text(dump_yaml(self.cloudberry_objects()))
        self.config_file.write_text(config_yaml(self.config))
        kube.write_kubeconfig(self.kubeconfig)
        token = kube.service_account_token(self.namespace, self.config.release_name, seconds=7 * 24 * 3600)
        kube.write_kubeconfig(self.manager_kubeconfig, token=token)
        return self

    def unregister(self) -> None:
        """Delete the cluster-scoped Shard and Consumer install() created (on an apiserver shared by tests)."""
        with self.kube.admin_client() as client:
            rest = Rest(client)
            rest.delete(SHARDS, self.shard)
            rest.delete(CONSUMERS, self.consumer)

    def _secret(
        self, rest: Rest, name: str, data: dict[str, str], type_: str = "Opaque", namespace: str | None = None
    ) -> None:
        namespace = namespace or self.namespace
        rest.create(SECRETS, opaque_secret(name, namespace, data, type_), namespace)

    def _tls(self, rest: Rest) -> None:
        authority = CertificateAuthority(self.state_dir / "pki", "dbprovider-api")
        cert = authority.issue_server("api", ("localhost",))
        self.ca_file, self.tls_cert, self.tls_key = authority.ca_file, cert.cert_file, cert.key_file
        self._secret(
            rest,
            self.config.tls.secret_name,
            {"tls.crt": cert.cert_file.read_text(), "tls.key": cert.key_file.read_text()},
            "kubernetes.io/tls",
        )

    def _shard(self, rest: Rest) -> None:
        self._secret(
            rest,
            self.admin_secret,
            {"user": self.postgres.PROVISIONER, "password": self.postgres.provisioner_password},
            namespace=self.shard_secrets_namespace,
        )
        rest.create(
            SHARDS,
            {
                "apiVersion": API_VERSION,
                "kind": KIND_SHARD,
                "metadata": {"name": self.shard},
                "spec": {
                    "maxDatabases": self.max_databases,
                    "perconaCluster": {"namespace": self.namespace, "name": self.shard},
                    # The local server's certificate comes from a throwaway CA: TLS, not verified.
                    "admin": {
                        "serviceName": f"{self.shard}-primary",
                        "port": self.postgres.port,
                        "sslmode": "require",
                        "secretRef": {"namespace": self.shard_secrets_namespace, "name": self.admin_secret},
                    },
                    "client": self.client_endpoint(),
                },
            },
        )

    def client_endpoint(self) -> dict[str, Any]:
        """Where consumers log in: the server itself, or a Patroni cluster's pgBouncer (with its pooler, so
        new tenant databases let pgBouncer's auth_query run there)."""
        if isinstance(self.postgres, PatroniShard):
            return {
                "host": "127.0.0.1",
                "port": self.postgres.client_port,
                "sslmode": "require",
                "pooler": {"authUser": POOLER_AUTH_USER, "template": "template1"},
            }
        return {"host": "127.0.0.1", "port": self.postgres.port, "sslmode": "require"}

    def _consumer(self, rest: Rest) -> None:
        self.add_consumer(rest, self.consumer, 10, self.token)

    def add_consumer(self, rest: Rest, name: str, max_databases: int | None, token: str | None = None) -> str:
        """A Consumer with its token Secret (`<name>-token`, as `dbprovider consumer new` names it) in the
        release namespace; returns its token (a fresh one unless given)."""
        token = token or secrets.token_hex(32)
        token_secret = f"{name}-token"
        self._secret(rest, token_secret, {DEFAULT_TOKEN_KEY: hash_token(token)})
        spec: dict[str, Any] = {
            "tokenSecretRef": {"namespace": self.namespace, "name": token_secret, "key": DEFAULT_TOKEN_KEY}
        }
        if max_databases is not None:
            spec["maxDatabases"] = max_databases
        rest.create(
            CONSUMERS, {"apiVersion": API_VERSION, "kind": KIND_CONSUMER, "metadata": {"name": name}, "spec": spec}
        )
        return token

    def cloudberry_objects(self, name: str = "dev-cloudberry") -> list[dict[str, Any]]:
        """A Keldon DatabaseCluster and a cloudberry Shard on it, served by the local PostgreSQL."""
        cluster = {
            "apiVersion": f"{KELDON_GROUP}/{KELDON_VERSION}",
            "kind": KELDON_KIND_DATABASE_CLUSTER,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"segments": {"count": 2}},
        }
        shard = {
            "apiVersion": API_VERSION,
            "kind": KIND_SHARD,
            "metadata": {"name": name},
            "spec": {
                "engine": Engine.CLOUDBERRY.value,
                "maxDatabases": 20,
                "keldonCluster": {"namespace": self.namespace, "name": name},
                # The admin Service is the cluster's (named like it); dev connects to 127.0.0.1 instead.
                "admin": {
                    "port": self.postgres.port,
                    "sslmode": "require",
                    "secretRef": {"namespace": self.shard_secrets_namespace, "name": self.admin_secret},
                },
                "client": {"host": "127.0.0.1", "port": self.postgres.port, "sslmode": "require"},
            },
        }
        return [cluster, shard]

    def manager_argv(self, python: str, api_port: int | None = None, metrics_port: int | None = None) -> list[str]:
        """`dbprovider manager` for this stack (TLS files via DBPROVIDER_TLS_CERT/KEY, see manager_env)."""
        return [
            python,
            "-m",
            "dbprovider.cli",
            "manager",
            "--config",
            str(self.config_file),
            "--kubeconfig",
            str(self.manager_kubeconfig),
            "--api-port",
            str(api_port or self.api_port),
            "--metrics-port",
            str(metrics_port or self.metrics_port),
            "--admin-host-override",
            "127.0.0.1",
        ]

    def manager_env(self) -> dict[str, str]:
        return {SETTINGS.env.tls_cert: str(self.tls_cert), SETTINGS.env.tls_key: str(self.tls_key)}

    def env(self) -> dict[str, str]:
        """What a shell needs to drive the stack (the env file of `dbprovider dev`)."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "DBPROVIDER_API_URL": self.api_url,
            "DBPROVIDER_CA_FILE": str(self.ca_file),
            "DBPROVIDER_TOKEN": self.token,
        }
