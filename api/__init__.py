"""The consumer API (Falcon): authentication, quotas, database lifecycle and credentials.

Reads the shared informer caches; never imports `reconciler`.

    components = build_api(config, informers, registry=registry)   # before informers.start()
    server = ApiServer(components.app, "0.0.0.0", 8443, cert_file, key_file).start()
"""

from api.app import ApiComponents, build_api, create_app
from api.auth import AuthMiddleware, TokenIndex
from api.observability import ApiMetrics
from api.server import ApiServer
from api.store import DatabaseStore

__all__ = [
    "ApiComponents",
    "ApiMetrics",
    "ApiServer",
    "AuthMiddleware",
    "DatabaseStore",
    "TokenIndex",
    "build_api",
    "create_app",
]
