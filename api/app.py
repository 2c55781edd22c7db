"""The consumer API as a Falcon WSGI app.

    store = DatabaseStore.register(config, informers)        # Databases, Consumers, Secrets informers
    tokens = TokenIndex.register(informers, config.namespace)
    app = create_app(config, store, tokens, registry=metrics_registry)
    server = ApiServer(app, "0.0.0.0", 8443, cert_file, key_file).start()

`build_api(config, informers, registry)` does the first three lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import falcon
import yaml
from prometheus_client import CollectorRegistry

from api.auth import AuthMiddleware, TokenIndex
from api.errors import register_error_handlers
from api.observability import ApiMetrics, ObservabilityMiddleware
from api.routes import (
    CredentialsRotation,
    Database,
    DatabaseCollection,
    DatabaseCredentials,
    Health,
    OpenApiDocument,
    Readiness,
    Undelete,
)
from api.store import DatabaseStore
from domain.config import InstallConfig
from domain.settings import SETTINGS, QuotaTimings
from informers import SharedInformers

OPENAPI_PATH = Path(__file__).resolve().with_name("openapi.yaml")
MAX_BODY_BYTES = 16 * 1024

ROUTE_DATABASES = "/v1/databases"
ROUTE_DATABASE = "/v1/databases/{externalId}"
ROUTE_CREDENTIALS = "/v1/databases/{externalId}/credentials"
ROUTE_ROTATE = "/v1/databases/{externalId}/credentials/rotate"
ROUTE_UNDELETE = "/v1/databases/{externalId}/undelete"


def load_openapi(path: Path = OPENAPI_PATH) -> tuple[bytes, bytes]:
    """The OpenAPI document as kept in the repository (YAML bytes) and as JSON."""
    yaml_bytes = path.read_bytes()
    document = yaml.safe_load(yaml_bytes)
    return yaml_bytes, json.dumps(document, indent=2, sort_keys=False).encode("utf-8")


def create_app(
    config: InstallConfig,
    store: DatabaseStore,
    tokens: TokenIndex,
    *,
    registry: CollectorRegistry | None = None,
    metrics: ApiMetrics | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    ready_checks: Iterable[Callable[[], bool]] = (),
    openapi_path: Path = OPENAPI_PATH,
) -> falcon.App[falcon.Request, falcon.Response]:
    """The WSGI app. `registry` receives the request metrics (or pass `metrics` built on one).

    /readyz is 200 once the store's and the token index's informers have synced (and every extra
    `ready_checks` callable returns True); /healthz is 200 while the process serves requests.
    """
    metrics = metrics if metrics is not None else ApiMetrics(registry)
    app: falcon.App[falcon.Request, falcon.Response] = falcon.App(
        middleware=[ObservabilityMiddleware(metrics), AuthMiddleware(tokens)],
        cors_enable=False,
    )
    app.req_options.strip_url_path_trailing_slash = False
    register_error_handlers(app)

    app.add_route(ROUTE_DATABASES, DatabaseCollection(config, store))
    app.add_route(ROUTE_DATABASE, Database(config, store, max_body_bytes))
    app.add_route(ROUTE_CREDENTIALS, DatabaseCredentials(store))
    app.add_route(ROUTE_ROTATE, CredentialsRotation(config, store, max_body_bytes))
    app.add_route(ROUTE_UNDELETE, Undelete(config, store, max_body_bytes))
    app.add_route(SETTINGS.probes.liveness, Health())  # the Deployment probes these paths
    app.add_route(SETTINGS.probes.readiness, Readiness([store.ready, tokens.ready, *ready_checks]))
    yaml_bytes, json_bytes = load_openapi(openapi_path)
    document = OpenApiDocument(yaml_bytes, json_bytes)
    app.add_route("/openapi.json", document)
    app.add_route("/openapi.yaml", document, suffix="yaml")
    return app


@dataclass(frozen=True)
class ApiComponents:
    app: falcon.App[falcon.Request, falcon.Response]
    store: DatabaseStore
    tokens: TokenIndex
    metrics: ApiMetrics


def build_api(
    config: InstallConfig,
    informers: SharedInformers,
    *,
    registry: CollectorRegistry | None = None,
    ready_checks: Iterable[Callable[[], bool]] = (),
    apiserver_reachable: Callable[[], bool] | None = None,
    quota_timings: QuotaTimings = SETTINGS.quota,
    **app_options: object,
) -> ApiComponents:
    """Register the API's informers, indexes and handlers on `informers` and build the app.

    Call before `informers.start()` (or the manager's start): the informers are Databases and Secrets in
    the release namespace and the cluster-scoped Consumers; writes go through `informers.rest`.
    `apiserver_reachable` (recent apiserver contact) gates /readyz and makes writes answer 503 at
    once while it is False. `quota_timings` go to the quota ledgers (api.quota_ledgers.QuotaLedgers), e.g.
    a shorter `reservation_timeout` in tests.
    """
    metrics = ApiMetrics(registry)
    store = DatabaseStore.register(
        config, informers, reachable=apiserver_reachable, quota_timings=quota_timings, registry=metrics.registry
    )
    admin_secrets = config.shard_secrets_by_namespace().get(config.namespace, ())
    tokens = TokenIndex.register(informers, config.namespace, admin_secrets)
    app = create_app(config, store, tokens, metrics=metrics, ready_checks=ready_checks, **app_options)  # type: ignore[arg-type]
    return ApiComponents(app=app, store=store, tokens=tokens, metrics=metrics)
