"""Errors of the consumer API and the one place where exceptions become HTTP responses.

Resources and the store raise; `register_error_handlers` maps every exception to `{"error": code,
"message": text}` with the right status, so responders carry no try/except. Messages are fixed texts or
built from validated values only: they never echo a request body, a header or a secret.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import falcon
import urllib3
from kubernetes.client.exceptions import ApiException

from domain.config import UnknownSizeClass
from domain.naming import InvalidExternalId

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error with a fixed HTTP status and a stable machine-readable code.

    Subclasses name theirs in the class statement: `class X(ApiError, status=..., code=..., message=...)`.
    """

    status: str = falcon.HTTP_500
    code: str = "internal_error"
    default_message: str = "internal error"

    def __init_subclass__(cls, *, status: str, code: str, message: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status, cls.code, cls.default_message = status, code, message

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)


# The body of an unexpected failure, the app's or the front door's (api.server): nothing of the cause.
INTERNAL_ERROR_BODY = json.dumps({"error": ApiError.code, "message": ApiError.default_message})


class InvalidBody(ApiError, status=falcon.HTTP_400, code="invalid_body", message="the request body is invalid"):
    """Not JSON, not an object, an unknown field or a wrong type; the message never echoes the body."""


class Unauthorized(ApiError, status=falcon.HTTP_401, code="unauthorized", message="authentication required"):
    """Every authentication failure; rendered as the same bare 401 whatever the cause."""


# The body of every authentication failure: one fixed text, whatever the cause.
UNAUTHORIZED_BODY = json.dumps({"error": Unauthorized.code, "message": Unauthorized.default_message})


class NotFound(ApiError, status=falcon.HTTP_404, code="not_found", message="no such database"):
    """No such database of this consumer (another consumer's database is exactly as absent)."""


class DatabaseDeleting(
    ApiError, status=falcon.HTTP_409, code="database_deleting", message="the database is being deleted"
):
    """A PUT of a database whose deletion was requested: it is not brought back."""


class UndeleteNotAllowed(
    ApiError,
    status=falcon.HTTP_403,
    code="undelete_not_allowed",
    message="this provider does not let consumers undo a delete; its operators can recover the database",
):
    """An undelete while the install's softDelete.allowUndelete is off (answered before any lookup)."""


class DatabaseGone(
    ApiError,
    status=falcon.HTTP_410,
    code="database_gone",
    message="the database is dropped or about to be: its retention window is over and it cannot be brought back",
):
    """An undelete of a database that is dropped, past (or within moments of) its dropAfter, or being removed."""


class NotReady(ApiError, status=falcon.HTTP_409, code="not_ready", message="the database is not ready"):
    """Credentials or a rotation asked of a database that is not Ready (or on its way out)."""


class PayloadTooLarge(
    ApiError, status=falcon.HTTP_413, code="payload_too_large", message="the request body is too large"
):
    """A body above the API's limit (also a chunked one)."""


class UnsupportedMediaType(
    ApiError,
    status=falcon.HTTP_415,
    code="unsupported_media_type",
    message="the request body must be JSON (Content-Type: application/json)",
):
    """A non-empty body that is not declared as JSON."""


class QuotaExceeded(
    ApiError, status=falcon.HTTP_429, code="quota_exceeded", message="the consumer's database quota is exhausted"
):
    """A create beyond Consumer.spec.maxDatabases."""


class TooManyRequests(
    ApiError,
    status=falcon.HTTP_429,
    code="too_many_requests",
    message="too many requests of this consumer at once; retry after the time in Retry-After",
):
    """The consumer already has api.maxRequestsPerConsumer requests in progress (answered with Retry-After)."""

    retry_after = 1


class CredentialsUnavailable(
    ApiError,
    status=falcon.HTTP_503,
    code="credentials_unavailable",
    message="the credentials of this database are temporarily unavailable",
):
    """The credentials Secret is missing, not ours or inconsistent, or a new password is pending."""


class Unavailable(
    ApiError, status=falcon.HTTP_503, code="unavailable", message="the service is temporarily unavailable"
):
    """The apiserver is unreachable or the write cannot be done now; the client may retry."""


KUBE_API_SLOW = "the Kubernetes API did not answer in time; try again"
KUBE_API_UNREACHABLE = "the Kubernetes API is unreachable; try again"


# Codes and texts of Falcon's own errors (routing, methods, headers), in the same body format. The front
# door (api.server) answers the statuses it refuses by itself with these codes too.
FALCON_ERRORS = {
    400: ("bad_request", "the request is malformed"),
    404: ("not_found", "no such resource"),
    405: ("method_not_allowed", "this method is not allowed on this resource"),
    411: ("length_required", "a Content-Length is required"),
    413: (PayloadTooLarge.code, PayloadTooLarge.default_message),  # Falcon's own (e.g. Content-Length) says ours
    414: ("uri_too_long", "the request URI is too long"),
    415: (UnsupportedMediaType.code, "the request body must be JSON"),
    431: ("headers_too_large", "the request headers are too large"),
}


def _write(resp: falcon.Response, status: str | int, code: str, message: str) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps({"error": code, "message": message})


def _write_unauthorized(resp: falcon.Response) -> None:
    resp.status = falcon.HTTP_401
    resp.content_type = falcon.MEDIA_JSON
    resp.text = UNAUTHORIZED_BODY
    resp.set_header("WWW-Authenticate", "Bearer")


def _handle_api_error(req: falcon.Request, resp: falcon.Response, ex: ApiError, params: dict[str, Any]) -> None:
    if isinstance(ex, Unauthorized):
        _write_unauthorized(resp)
        return
    _write(resp, ex.status, ex.code, ex.message)
    if isinstance(ex, TooManyRequests):
        resp.set_header("Retry-After", str(ex.retry_after))


def _handle_invalid_external_id(
    req: falcon.Request, resp: falcon.Response, ex: InvalidExternalId, params: dict[str, Any]
) -> None:
    _write(resp, falcon.HTTP_400, "invalid_external_id", str(ex))


def _handle_unknown_size_class(
    req: falcon.Request, resp: falcon.Response, ex: UnknownSizeClass, params: dict[str, Any]
) -> None:
    # str(ex) names the class only if it is a well-formed class name (never arbitrary input).
    _write(resp, falcon.HTTP_400, "unknown_size_class", str(ex))


def _handle_http_error(
    req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict[str, Any]
) -> None:
    code, message = FALCON_ERRORS.get(ex.status_code, ("error", "the request failed"))
    _write(resp, ex.status, code, message)
    for name, value in dict(ex.headers or {}).items():
        resp.set_header(name, value)


def _handle_kube_error(req: falcon.Request, resp: falcon.Response, ex: ApiException, params: dict[str, Any]) -> None:
    # An unexpected apiserver answer (403, 5xx, timeout): the body may quote objects, so log the status only.
    log.error("kube-apiserver request failed during %s %s: HTTP %s", req.method, req.uri_template, ex.status)
    _write(resp, falcon.HTTP_503, Unavailable.code, Unavailable.default_message)


def _handle_transport_error(
    req: falcon.Request, resp: falcon.Response, ex: urllib3.exceptions.HTTPError, params: dict[str, Any]
) -> None:
    # The apiserver did not answer in time or refused the connection: a prompt 503, not a 500. Which of
    # the two, said as it is: a slow apiserver (one starved of CPU) is not a gone one.
    log.error("kube-apiserver request failed during %s %s: %s", req.method, req.uri_template, type(ex).__name__)
    _write(resp, falcon.HTTP_503, Unavailable.code, transport_error_message(ex))


def transport_error_message(ex: urllib3.exceptions.HTTPError) -> str:
    """A timeout says so; a refused or broken connection is unreachable (urllib3 makes a refused connection,
    NewConnectionError, a kind of ConnectTimeoutError for old callers' sake)."""
    slow = isinstance(ex, urllib3.exceptions.TimeoutError) and not isinstance(ex, urllib3.exceptions.NewConnectionError)
    return KUBE_API_SLOW if slow else KUBE_API_UNREACHABLE


def _handle_unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: dict[str, Any]) -> None:
    # The exception text may contain request data: log the type only (the traceback at debug level).
    log.error("unhandled %s during %s %s", type(ex).__name__, req.method, req.uri_template)
    log.debug("traceback of the unhandled error", exc_info=(type(ex), ex, ex.__traceback__))
    _write(resp, falcon.HTTP_500, ApiError.code, ApiError.default_message)


def register_error_handlers(app: falcon.App[falcon.Request, falcon.Response]) -> None:
    """Map every exception to the JSON error body; Falcon picks the most specific handler by class."""
    app.add_error_handler(Exception, _handle_unexpected)
    app.add_error_handler(ApiException, _handle_kube_error)
    app.add_error_handler(urllib3.exceptions.HTTPError, _handle_transport_error)
    app.add_error_handler(falcon.HTTPError, _handle_http_error)
    app.add_error_handler(ApiError, _handle_api_error)
    app.add_error_handler(InvalidExternalId, _handle_invalid_external_id)
    app.add_error_handler(UnknownSizeClass, _handle_unknown_size_class)
