"""What goes over the wire: the PUT body, the Database view and the credentials view.

The shapes are those of `api/openapi.yaml`; tests validate live responses against that document.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from api.errors import InvalidBody, UnsupportedMediaType
from domain.conditions import READY, condition_reason
from domain.config import MAX_ROTATION_OVERLAP, InstallConfig, UnknownSizeClass
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_ROTATE_REQUESTED_AT,
    CREDENTIALS_KEYS,
    SIZE_CLASS_MAX_LENGTH,
    Engine,
    Phase,
)
from domain.credentials import CA_CERT_KEY
from domain.metadata import object_name
from domain.objects import DatabaseObject, Obj
from domain.timefmt import format_time

log = logging.getLogger(__name__)

BODY_FIELDS = ("sizeClass", "engine")
ROTATE_BODY_FIELDS = ("terminateSessions", "overlapSeconds")
MAX_OVERLAP_SECONDS = int(MAX_ROTATION_OVERLAP.total_seconds())
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class CreateDatabase:
    """A validated PUT body."""

    size_class: str = ""
    engine: Engine = Engine.POSTGRES


def _is_json_media_type(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type in _JSON_TYPES or (media_type.startswith("application/") and media_type.endswith("+json"))


def _json_object(raw: bytes, content_type: str | None, fields: tuple[str, ...]) -> dict[str, Any]:
    """A JSON object body with only `fields` ({} for an empty body); the messages never echo the body."""
    if not raw.strip():
        return {}
    if not _is_json_media_type(content_type):
        raise UnsupportedMediaType()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidBody("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidBody("the request body must be a JSON object")
    if any(key not in fields for key in data):
        raise InvalidBody(f"unknown field in the request body (allowed: {', '.join(fields)})")
    return data


@dataclass(frozen=True)
class RotateRequest:
    """A rotate request: end the old sessions, and how long the old credentials keep working (None:
    the install's `rotation.defaultOverlap`)."""

    terminate_sessions: bool = False
    overlap_seconds: int | None = None

    def overlap(self, config: InstallConfig) -> int:
        """The overlap in seconds: none with terminateSessions (the old credentials stop at once)."""
        if self.terminate_sessions:
            return 0
        if self.overlap_seconds is not None:
            return self.overlap_seconds
        return int(config.rotation.default_overlap.total_seconds())


def parse_rotate_body(raw: bytes, content_type: str | None) -> RotateRequest:
    """The rotate body: empty, or `{"terminateSessions": <bool>, "overlapSeconds": <0..86400>}` (both optional)."""
    data = _json_object(raw, content_type, ROTATE_BODY_FIELDS)
    terminate = data.get("terminateSessions", False)
    if not isinstance(terminate, bool):
        raise InvalidBody("terminateSessions must be true or false")
    overlap = data.get("overlapSeconds")
    if overlap is not None and (
        isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= MAX_OVERLAP_SECONDS
    ):
        raise InvalidBody(f"overlapSeconds must be an integer from 0 to {MAX_OVERLAP_SECONDS}")
    if terminate and overlap:
        raise InvalidBody("terminateSessions ends the old credentials at once: it takes no overlapSeconds")
    return RotateRequest(terminate, overlap)


def parse_empty_body(raw: bytes, content_type: str | None) -> None:
    """A body that takes no fields (undelete): empty or `{}`."""
    if _json_object(raw, content_type, ()):
        raise InvalidBody("this request takes no fields")


def parse_create_body(raw: bytes, content_type: str | None, config: InstallConfig) -> CreateDatabase:
    """Validate the PUT body: empty or a JSON object with optional `sizeClass` and `engine`, nothing else.

    Raises InvalidBody / UnsupportedMediaType; the messages never echo the body.
    """
    data = _json_object(raw, content_type, BODY_FIELDS)
    if not data:
        return CreateDatabase()
    size_class = data.get("sizeClass", "")
    if not isinstance(size_class, str):
        raise InvalidBody("sizeClass must be a string")
    if len(size_class) > SIZE_CLASS_MAX_LENGTH:
        raise InvalidBody(f"sizeClass must be at most {SIZE_CLASS_MAX_LENGTH} characters")
    engine = data.get("engine", Engine.POSTGRES.value)
    if not isinstance(engine, str) or engine not in {e.value for e in Engine}:
        raise InvalidBody("engine must be one of: " + ", ".join(e.value for e in Engine))
    if engine == Engine.CLOUDBERRY and not config.engines.cloudberry.enabled:
        raise InvalidBody("engine cloudberry is not enabled on this provider")
    return CreateDatabase(size_class=size_class, engine=Engine(engine))


def read_database(obj: Obj) -> DatabaseObject | None:
    """The Database parsed once (metadata, spec, status): the API's read boundary.

    None if its metadata or spec do not validate (such an object is no one's: never shown). A status that
    does not validate reads as empty: nothing is handed out and the database shows as Provisioning.
    """
    try:
        db, status_valid = DatabaseObject.parse_lenient_status(obj)
    except ValidationError:
        log.warning("Database %s: spec does not validate; not shown", object_name(obj))
        return None
    if not status_valid:
        log.warning("Database %s: status does not validate; shown as not reconciled", db.name)
    return db


def is_delete_requested(db: DatabaseObject) -> bool:
    """Deleting, Deleted, the delete annotation or a Kubernetes deletion: the database is going away."""
    return (
        db.status.phase in (Phase.DELETING, Phase.DELETED)
        or ANNOTATION_DELETE_REQUESTED_AT in db.metadata.annotations
        or db.metadata.deleting
    )


def is_ready(db: DatabaseObject) -> bool:
    """Ready and not on its way out: credentials may be handed out and rotated."""
    return db.status.phase == Phase.READY and not is_delete_requested(db)


def database_view(db: DatabaseObject, config: InstallConfig, credentials_version: str | None = None) -> dict[str, Any]:
    """The consumer's view of a Database object: state and settings, never secrets or shard internals.

    `credentials_version` (api.store.DatabaseStore.credentials_version) changes when the credentials do.
    """
    spec, state, notes = db.spec, db.status, db.metadata.annotations
    limit = state.applied_connection_limit
    if limit is None:
        try:
            limit = config.resolve_connection_limit(spec.size_class)
        except UnknownSizeClass:
            limit = None
    rotate_requested = notes.get(ANNOTATION_ROTATE_REQUESTED_AT)
    return {
        "externalId": spec.external_id,
        "phase": (state.phase or Phase.PROVISIONING).value,
        "reason": condition_reason(state.conditions, READY),
        "sizeClass": spec.size_class,
        "connectionLimit": limit,
        "engine": spec.engine.value,
        "createdAt": db.metadata.creation_timestamp,
        "deleteRequestedAt": notes.get(ANNOTATION_DELETE_REQUESTED_AT),
        "dropAfter": format_time(state.drop_after) if state.drop_after is not None else None,
        "rotateRequestedAt": rotate_requested,
        "rotationPending": bool(rotate_requested) and state.rotation_applied != rotate_requested,
        "credentialsVersion": credentials_version,
    }


def list_etag(items: list[dict[str, Any]]) -> str:
    """The strong ETag of a database list: a digest of its canonical JSON, so equal lists give equal tags
    on every replica, and any visible change (phase, reason, dropAfter, credentialsVersion...) a new one."""
    canonical = json.dumps(items, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Credentials:
    host: str
    port: int
    database: str
    user: str
    password: str
    sslmode: str
    ca_cert: str | None = None

    @classmethod
    def of_secret(cls, values: Mapping[str, str]) -> Credentials:
        """From a credentials Secret's decoded data, whose keys (CREDENTIALS_KEYS) the caller checked;
        the CA that signs the client endpoint's certificate when the Secret holds one."""
        host, port, database, user, password, sslmode = (values[key] for key in CREDENTIALS_KEYS)
        return cls(host, int(port), database, user, password, sslmode, values.get(CA_CERT_KEY) or None)

    def uri(self) -> str:
        """A libpq connection URI with every component percent-encoded."""
        user = quote(self.user, safe="")
        password = quote(self.password, safe="")
        database = quote(self.database, safe="")
        sslmode = quote(self.sslmode, safe="")
        return f"postgresql://{user}:{password}@{self.host}:{self.port}/{database}?sslmode={sslmode}"

    def view(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "database": self.database,
            "user": self.user,
            "password": self.password,
            "sslmode": self.sslmode,
            "uri": self.uri(),
        } | ({"caCert": self.ca_cert} if self.ca_cert else {})
