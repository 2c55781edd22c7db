"""The API suite's environment: the provider's CRDs and RBAC on the real apiserver, the API served over TLS.

`ApiEnv` runs the API exactly as the manager will: informers on the REAL kube-apiserver, authenticated
as the provider's own ServiceAccount (so the rendered RBAC is proven sufficient), served by the
API's front door (api/server.py) with TLS on a loopback port. Tests talk to it with `requests` over
real sockets, trusting a test CA.

It also plays the reconciler where a test needs it (admin writes of a Database's status and of its
credentials Secret), and remembers every token, hash and password it creates so the suite can prove
that none of them ever reaches the logs.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client import CollectorRegistry

from api import ApiServer, build_api
from api.app import ApiComponents
from api.server import FrontDoorOptions
from domain.config import InstallConfig, load_install_config
from domain.constants import (
    ANNOTATION_PASSWORD_ID,
    API_VERSION,
    KIND_CONSUMER,
    KIND_DATABASE,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from domain.naming import credentials_secret_name, database_object_name, label_value
from domain.resources import CONSUMERS, DATABASES
from harness.certs import CertificateAuthority
from informers import SECRETS, Rest, SharedInformers
from tests.support.common import b64, now_stamp, unique, wait_for
from tests.support.install import release_config
from tests.support.kubeapi import KubeApi, apply_all

RELEASE = "apitest"
NAMESPACE = "apitest-system"
OTHER_NAMESPACE = "apitest-elsewhere"

# No shardSecrets: the API suite runs no controllers.
CONFIG = release_config(RELEASE, NAMESPACE)


def new_token() -> str:
    """A consumer token as `dbprovider consumer new` makes one: 256 random bits, hex."""
    return secrets.token_hex(32)


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Consumer:
    name: str
    token: str
    secret_name: str


@dataclass
class ApiEnv:
    config: InstallConfig
    admin: Rest
    informers: SharedInformers
    components: ApiComponents
    registry: CollectorRegistry
    server: ApiServer
    ca_file: Path
    cert_file: Path
    key_file: Path
    sensitive: set[str] = field(default_factory=set)
    consumers_created: list[str] = field(default_factory=list)

    # -- HTTP ------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def session(self) -> requests.Session:
        session = requests.Session()
        session.verify = str(self.ca_file)
        return session

    def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        session: requests.Session | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        sender = session or requests
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("verify", str(self.ca_file))  # explicit: REQUESTS_CA_BUNDLE would beat session.verify
        return sender.request(method, self.base_url + path, headers=all_headers, **kwargs)

    def wait_status(self, method: str, path: str, token: str | None, status: int, timeout: float = 20.0) -> None:
        """Poll until the API answers `status` (informer propagation is asynchronous)."""
        wait_for(lambda: self.call(method, path, token).status_code == status, timeout, f"{method} {path} -> {status}")

    # -- secrets bookkeeping -----------------------------------------------------------------------

    def remember(self, *values: str) -> None:
        """Values that must never appear in any log record."""
        for value in values:
            if value:
                self.sensitive.add(value)
                self.sensitive.add(b64(value))

    # -- consumers -------------------------------------------------------------------------------

    def hash_secret(self, name: str, lines: Iterable[str], *, key: str = "sha256", namespace: str = NAMESPACE) -> None:
        value = "".join(f"{line}\n" for line in lines)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {key: b64(value)},
        }
        self.remember(value.strip())
        try:
            self.admin.create(SECRETS, body, namespace)
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
            self.admin.replace(SECRETS, {**body, "metadata": {"name": name, "namespace": namespace}})

    def new_consumer(
        self,
        *,
        tokens: int = 1,
        hash_lines: list[str] | None = None,
        max_databases: int | None = None,
        disabled: bool = False,
        secret_namespace: str = NAMESPACE,
        secret_key: str = "sha256",
        create_secret: bool = True,
        name: str | None = None,
    ) -> Consumer:
        """A Consumer with a token Secret holding the hash of a fresh token (and `hash_lines` if given)."""
        name = name or unique("apitest-c")
        token = new_token()
        self.remember(token, sha256_hex(token), sha256_hex(token).upper())
        secret_name = f"{name}-token"
        if create_secret:
            lines = hash_lines if hash_lines is not None else [sha256_hex(token)]
            self.hash_secret(secret_name, lines, namespace=secret_namespace)
        spec: dict[str, Any] = {
            "tokenSecretRef": {"namespace": secret_namespace, "name": secret_name, "key": secret_key},
            "disabled": disabled,
        }
        if max_databases is not None:
            spec["maxDatabases"] = max_databases
        self.admin.create(
            CONSUMERS, {"apiVersion": API_VERSION, "kind": KIND_CONSUMER, "metadata": {"name": name}, "spec": spec}
        )
        self.consumers_created.append(name)
        return Consumer(name=name, token=token, secret_name=secret_name)

    def ready_consumer(self, **kwargs: Any) -> Consumer:
        """A consumer whose token already authenticates."""
        consumer = self.new_consumer(**kwargs)
        self.wait_status("GET", "/v1/databases", consumer.token, 200)
        return consumer

    def patch_consumer(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.admin.patch(CONSUMERS, name, {"spec": spec})

    # -- databases (playing the reconciler) ------------------------------------------------------

    def database(self, consumer: str, external_id: str) -> dict[str, Any]:
        return self.admin.get(DATABASES, database_object_name(consumer, external_id), NAMESPACE)

    def set_status(self, consumer: str, external_id: str, status: dict[str, Any]) -> dict[str, Any]:
        name = database_object_name(consumer, external_id)
        return self.admin.patch(DATABASES, name, {"status": status}, NAMESPACE, subresource="status")

    def make_ready(self, consumer: str, external_id: str, tenant: str = "t_tenant_0123456789") -> dict[str, Any]:
        now = now_stamp()
        db = self.set_status(
            consumer,
            external_id,
            {
                "phase": "Ready",
                "shard": "apitest-shard",
                "tenantName": tenant,
                "appliedSizeClass": "",
                "appliedConnectionLimit": 10,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Provisioned",
                        "message": "",
                        "lastTransitionTime": now,
                    }
                ],
            },
        )
        rv = db["metadata"]["resourceVersion"]
        databases = self.components.store.databases
        key = f"{NAMESPACE}/{db['metadata']['name']}"
        wait_for(lambda: (databases.get(key) or {}).get("metadata", {}).get("resourceVersion") == rv, what="status")
        return db

    def credentials_secret(
        self,
        db: dict[str, Any],
        *,
        owned: bool = True,
        controller: bool = True,
        values: dict[str, str] | None = None,
        password_id: str | None = None,
    ) -> dict[str, Any]:
        """Write `<db>-credentials` as the reconciler does (ownerReference with controller: true;
        with `password_id`, the annotation naming its password)."""
        meta = db["metadata"]
        data = {
            "host": "pgbouncer.shard01.example",
            "port": "5432",
            "database": db.get("status", {}).get("tenantName", "t_tenant_0123456789"),
            "user": db.get("status", {}).get("tenantName", "t_tenant_0123456789"),
            "password": secrets.token_urlsafe(24),
            "sslmode": "require",
        }
        data.update(values or {})
        data = {k: v for k, v in data.items() if v is not None}
        self.remember(data.get("password", ""))
        metadata: dict[str, Any] = {
            "name": credentials_secret_name(meta["name"]),
            "namespace": NAMESPACE,
            # What puts it into the provider's Secrets cache, as the reconciler labels it.
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: label_value(db["spec"]["consumer"])},
        }
        if password_id is not None:
            metadata["annotations"] = {ANNOTATION_PASSWORD_ID: password_id}
        if owned:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND_DATABASE,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": controller,
                }
            ]
        encoded = {k: b64(v) for k, v in data.items()}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": encoded}
        try:
            created = self.admin.create(SECRETS, body, NAMESPACE)
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
            created = self.admin.replace(SECRETS, body)
        secrets_cache = self.components.store.secrets
        key = f"{NAMESPACE}/{metadata['name']}"
        rv = created["metadata"]["resourceVersion"]
        wait_for(lambda: (secrets_cache.get(key) or {}).get("metadata", {}).get("resourceVersion") == rv, what="secret")
        return data

    def delete_secret(self, name: str) -> None:
        try:
            self.admin.delete(SECRETS, name, NAMESPACE)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
        wait_for(lambda: self.components.store.secrets.get(f"{NAMESPACE}/{name}") is None, what="secret gone")

    def count_databases(self, consumer: str) -> int:
        items = self.admin.list(DATABASES, NAMESPACE)["items"]
        return sum(1 for db in items if db["spec"]["consumer"] == consumer)


class Served:
    """A second ApiServer on a free port with the env's certificate, for tests of server settings.

    with Served(app, env, header_timeout=2) as base:    # base = "https://127.0.0.1:<port>"
    """

    def __init__(
        self, app: Callable[..., Any], env: ApiEnv, registry: CollectorRegistry | None = None, **options: Any
    ) -> None:
        limits = FrontDoorOptions(**options)
        self.server = ApiServer(app, "127.0.0.1", 0, env.cert_file, env.key_file, options=limits, registry=registry)

    def __enter__(self) -> str:
        self.server.start()
        return f"https://127.0.0.1:{self.server.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def start_env(kube: Any, workdir: Path) -> ApiEnv:
    """Install the CRDs and RBAC, start informers as the provider's ServiceAccount, serve the API over TLS."""
    from infra.render import render_manifests

    config = load_install_config(CONFIG)
    for namespace in (NAMESPACE, OTHER_NAMESPACE):
        kube.ensure_namespace(namespace)
    admin_client = kube.admin_client()
    for attempt in range(3):  # a CRD read right after its creation can come back half-filled
        try:
            apply_all(KubeApi(admin_client), render_manifests(config))
            break
        except (TypeError, AttributeError):
            if attempt == 2:
                raise
            time.sleep(1)
    # The API runs with the provider's own identity: the rendered ServiceAccount and RBAC.
    configuration = kube.configuration(token=kube.service_account_token(NAMESPACE, RELEASE))
    configuration.connection_pool_maxsize = 32
    from kubernetes.client import ApiClient

    informers = SharedInformers(Rest(ApiClient(configuration)))
    registry = CollectorRegistry()
    components = build_api(config, informers, registry=registry)
    informers.start()
    if not informers.wait_for_sync(60):
        raise AssertionError("informers did not sync")
    ca = CertificateAuthority(workdir, "apitest")
    cert = ca.issue_server("apitest-server")
    server = ApiServer(
        components.app, "127.0.0.1", 0, cert.cert_file, cert.key_file, options=FrontDoorOptions(threads=16)
    ).start()
    env = ApiEnv(
        config, Rest(admin_client), informers, components, registry, server, ca.ca_file, cert.cert_file, cert.key_file
    )
    env.wait_status("GET", "/readyz", None, 200)
    return env


def stop_env(env: ApiEnv) -> None:
    env.server.stop()
    env.informers.stop()
    env.informers.rest.api_client.close()
    for name in env.consumers_created:
        try:
            env.admin.delete(CONSUMERS, name)
        except Exception:  # noqa: BLE001 - best effort
            pass
    for kind_path in (
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}",
        f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{RELEASE}",
    ):
        try:
            env.admin.request("DELETE", kind_path)
        except Exception:  # noqa: BLE001 - best effort
            pass
    env.admin.api_client.close()
