"""Falcon resources of the consumer API. Responders carry no try/except: errors map in api.errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon

from api.errors import PayloadTooLarge, Unavailable
from api.models import database_view, list_etag, parse_create_body, parse_empty_body, parse_rotate_body
from api.store import DatabaseStore
from domain.config import InstallConfig
from domain.objects import DatabaseObject

NO_STORE = "no-store"
DRAIN_FACTOR = 4


def read_body(req: falcon.Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes (PayloadTooLarge beyond, also for chunked bodies).

    A body that is too large is read and dropped up to 4 x `limit` first, so the client (still sending)
    receives the 413 instead of a connection reset; anything larger is not read at all.
    """
    too_large = PayloadTooLarge(f"the request body must be at most {limit} bytes")
    if req.content_length is not None and req.content_length > limit:
        if req.content_length <= DRAIN_FACTOR * limit:
            _drain(req, DRAIN_FACTOR * limit)
        raise too_large
    raw: bytes = _body_stream(req).read(limit + 1)
    if len(raw) > limit:
        _drain(req, DRAIN_FACTOR * limit)
        raise too_large
    return raw


def _body_stream(req: falcon.Request) -> Any:
    """A chunked body (no Content-Length) is read from the raw input, which the server terminates."""
    if req.content_length is None and req.env.get("wsgi.input_terminated"):
        return req.stream
    return req.bounded_stream


def _drain(req: falcon.Request, budget: int) -> None:
    stream = _body_stream(req)
    while budget > 0:
        chunk = stream.read(min(budget, 8192))
        if not chunk:
            return
        budget -= len(chunk)


class DatabaseCollection:
    """GET /v1/databases: the caller's databases, with an ETag; If-None-Match with the same tag gets 304."""

    def __init__(self, config: InstallConfig, store: DatabaseStore) -> None:
        self.config = config
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        consumer = req.context.consumer
        items = [database_view(db, self.config, self.store.credentials_version(db)) for db in self.store.list(consumer)]
        etag = list_etag(items)
        resp.etag = etag
        resp.cache_control = [NO_STORE]
        if any(tag in ("*", etag) for tag in req.if_none_match or ()):  # weak comparison (RFC 9110)
            resp.status = falcon.HTTP_304
            return
        resp.media = {"items": items}


class _DatabaseAction:
    """A route on one database that reads a bounded body and answers with the database's view."""

    def __init__(self, config: InstallConfig, store: DatabaseStore, max_body_bytes: int) -> None:
        self.config = config
        self.store = store
        self.max_body_bytes = max_body_bytes

    def _answer(self, resp: falcon.Response, db: DatabaseObject, status: str = falcon.HTTP_200) -> None:
        resp.status = status
        resp.media = database_view(db, self.config, self.store.credentials_version(db))
        resp.cache_control = [NO_STORE]


class Database(_DatabaseAction):
    """PUT / GET / DELETE /v1/databases/{externalId}."""

    def on_put(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        request = parse_create_body(read_body(req, self.max_body_bytes), req.content_type, self.config)
        db, created = self.store.ensure(req.context.consumer, externalId, request)
        self._answer(resp, db, falcon.HTTP_201 if created else falcon.HTTP_200)

    def on_get(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        self._answer(resp, self.store.get(req.context.consumer, externalId))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        self._answer(resp, self.store.request_deletion(req.context.consumer, externalId), falcon.HTTP_202)


class DatabaseCredentials:
    """GET /v1/databases/{externalId}/credentials."""

    def __init__(self, store: DatabaseStore) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        resp.media = self.store.credentials(req.context.consumer, externalId).view()
        resp.cache_control = [NO_STORE]


class CredentialsRotation(_DatabaseAction):
    """POST /v1/databases/{externalId}/credentials/rotate."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        request = parse_rotate_body(read_body(req, self.max_body_bytes), req.content_type)
        db = self.store.request_rotation(
            req.context.consumer, externalId, request.terminate_sessions, request.overlap(self.config)
        )
        self._answer(resp, db, falcon.HTTP_202)


class Undelete(_DatabaseAction):
    """POST /v1/databases/{externalId}/undelete: bring a soft-deleted database back (if the install allows it)."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, externalId: str) -> None:  # noqa: N803
        parse_empty_body(read_body(req, self.max_body_bytes), req.content_type)
        db = self.store.request_undelete(req.context.consumer, externalId)
        self._answer(resp, db, falcon.HTTP_202)


class Health:
    """GET /healthz: the process serves requests."""

    auth_required = False

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


class Readiness:
    """GET /readyz: the caches the API reads are synced (and every extra check passes)."""

    auth_required = False

    def __init__(self, checks: list[Callable[[], bool]]) -> None:
        self.checks = checks

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not all(check() for check in self.checks):
            raise Unavailable("not ready: the caches are not synced yet or the Kubernetes API is unreachable")
        resp.media = {"status": "ok"}


class OpenApiDocument:
    """GET /openapi.yaml (the file in the repository, byte for byte) and /openapi.json (the same as JSON)."""

    auth_required = False

    def __init__(self, yaml_bytes: bytes, json_bytes: bytes) -> None:
        self.yaml_bytes = yaml_bytes
        self.json_bytes = json_bytes

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.data = self.json_bytes
        resp.content_type = falcon.MEDIA_JSON

    def on_get_yaml(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.data = self.yaml_bytes
        resp.content_type = "application/yaml"
