"""A thin JSON client over `kubernetes.client.ApiClient` that works with plain dicts.

The generated API classes deserialize every object into models (slow, memory hungry, and
lossy for custom resources); informers and controllers only need dicts. This module builds
requests with `ApiClient.param_serialize` (so the configuration's auth, including bearer tokens
and their refresh hook, applies) and sends them with `ApiClient.call_api(method, url, headers,
body, post_params, _request_timeout)` (the v37 signature). Errors are raised as the client's own
`ApiException` subclasses (`ConflictException` for 409, `NotFoundException` for 404, ...), so
callers test `exc.status` exactly as they do with the generated API.
"""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from domain.objects import Obj
from domain.settings import SETTINGS
from informers.resource import Resource

Timeout = float | tuple[float, float] | None

DEFAULT_TIMEOUT: tuple[float, float] = SETTINGS.watch.request_timeout
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# Lists and watches of metadata only (PartialObjectMetadata): names, labels, resourceVersions, never
# a Secret's data, which stays in the apiserver (as client-go's metadata informers ask).
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

Query = list[tuple[str, str]]


def decode_json(data: bytes) -> Any:
    """A JSON body as plain dicts and lists: orjson, 1.6-2x as fast as the standard library on a list page
    (a start decodes every Database and credentials Secret of the fleet)."""
    return orjson.loads(data)


# How often the client's credential hook runs at most (seconds): see `throttle_credential_refresh`.
CREDENTIAL_REFRESH_EVERY = 1.0


def throttle_credential_refresh(
    configuration: Configuration,
    every: float = CREDENTIAL_REFRESH_EVERY,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run the configuration's credential hook at most once every `every` seconds, not per request.

    The kubernetes client calls `refresh_api_key_hook` before every request; the hooks of
    `load_incluster_config` and `load_kube_config` re-apply the whole configuration each time, and
    setting `host` reads the proxy variables of the whole environment (`urllib.request.getproxies`):
    40 us a request with 35 variables, 340 us with 335 (a pod gets seven per Service of its
    namespace), paid by every GET of an admin Secret and every Lease renewal.
    The hooks' own checks stay what they were, a second late at
    most: the in-cluster token file is read again once its minute is up, a kubeconfig token once
    its expiry has passed. The hooks re-install themselves when they run; the throttle is put back
    after each run. A copy of the configuration (`Rest.without_retries`) keeps its own time.
    """
    hook: Callable[[Configuration], None] | None = getattr(configuration, _HOOK, None)  # untyped in the client
    if hook is None:
        return

    def refresh(config: Configuration) -> None:
        now = clock()
        last: float | None = getattr(config, _REFRESHED_AT, None)  # per configuration: a copy has its own token
        if last is not None and now - last < every:
            return
        setattr(config, _REFRESHED_AT, now)
        try:
            hook(config)
        finally:
            setattr(config, _HOOK, refresh)

    setattr(configuration, _HOOK, refresh)


_HOOK = "refresh_api_key_hook"
_REFRESHED_AT = "_dbprovider_credentials_refreshed_at"


def _raise_for_status(response: Any) -> None:
    if 200 <= response.status <= 299:
        return
    data = response.read()
    text = data.decode("utf-8", errors="replace") if data else None
    ApiException.from_response(http_resp=response, body=text, data=None)  # always raises


def _body(response: Any) -> bytes:
    """The whole body of a finished response (`ApiException` on non-2xx); the connection goes back to the pool."""
    try:
        _raise_for_status(response)
        data: bytes = response.read()
    finally:
        response.response.release_conn()
    return data


class WatchStream:
    """An open streaming response (a watch); iterate `lines()`, `abort()` from another thread."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._aborted = False

    def lines(self) -> Iterator[bytes]:
        """The stream's non-empty lines (one watch event each). A chunk is split once, so a chunk holding many
        events (a streamed list's initial events come that way) costs time linear in its size."""
        rest = b""
        raw = self._response.response
        for chunk in raw.stream(amt=None, decode_content=True):
            if not chunk:
                continue
            *complete, rest = (rest + chunk).split(b"\n")
            for line in complete:
                if line.strip():
                    yield line
        if rest.strip():
            yield rest

    def abort(self) -> None:
        """Unblock a reader stuck in recv() by shutting the socket down (closing alone would not)."""
        self._aborted = True
        conn = getattr(self._response.response, "connection", None)
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        raw = self._response.response
        try:
            raw.close()
        finally:
            raw.release_conn()


class Rest:
    """Dict-in, dict-out Kubernetes requests on one `ApiClient` (thread-safe, like the client).

    `fence`, when given, is called before every request that is not a GET and may raise to stop
    it: the composition root passes the controllers a `Rest` fenced by leadership, so a replica
    that does not hold the Lease sends no write. Reads (and watches) are never fenced.
    `user_agent` replaces the client's User-Agent (the apiserver's audit log shows who wrote).
    """

    def __init__(
        self, api_client: ApiClient, fence: Callable[[], None] | None = None, user_agent: str | None = None
    ) -> None:
        self.api_client = api_client
        self.fence = fence
        self.user_agent = user_agent
        self.write_timeout: Timeout = DEFAULT_TIMEOUT  # what a write without a timeout of its own gets

    def fenced(
        self, fence: Callable[[], None], user_agent: str | None = None, write_timeout: Timeout | None = None
    ) -> Rest:
        """A `Rest` on the same client whose writes call `fence()` first. `write_timeout` bounds every write
        that names no timeout of its own: a leader's write must not arrive after its Lease could have
        passed to another replica, so it is bounded below the renew deadline."""
        fenced = Rest(self.api_client, fence, user_agent or self.user_agent)
        fenced.write_timeout = write_timeout if write_timeout is not None else self.write_timeout
        return fenced

    def without_retries(self) -> Rest:
        """A `Rest` on a client of its own that never retries a request behind the caller's back.

        The client's urllib3 pool retries a failed request up to three times by default (connect
        errors for every method, read timeouts for GET, PUT and DELETE), so a request bounded by a
        timeout of t could take 4t. Callers that must answer within a bound (the Lease renewal, the
        API's writes) use this one; the caller decides whether to try again.
        """
        configuration = copy.deepcopy(self.api_client.configuration)
        configuration.retries = False
        client = ApiClient(configuration)
        client.user_agent = self.api_client.user_agent
        return Rest(client, self.fence, self.user_agent)

    # -- raw -------------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str | None,
        timeout: Timeout,
        accept: str | None = None,
    ) -> Any:
        if method != "GET" and timeout is DEFAULT_TIMEOUT:  # the default, not a caller's own choice
            timeout = self.write_timeout
        headers = {"Accept": accept or "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method, url, headers, body, _ = self.api_client.param_serialize(
            method,
            path,
            query_params=list(query) if query else None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        if self.user_agent is not None:
            headers["User-Agent"] = self.user_agent
        return self.api_client.call_api(method, url, headers, body, None, _request_timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        accept: str | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON body; raise `ApiException` on non-2xx.

        `accept` replaces the JSON Accept header (e.g. METADATA_LIST_ACCEPT)."""
        if self.fence is not None and method != "GET":
            self.fence()
        data = _body(self._send(method, path, query, body, content_type, timeout, accept))
        return decode_json(data) if data else {}

    def get_bytes(
        self, path: str, *, query: Query | None = None, timeout: Timeout = DEFAULT_TIMEOUT, accept: str | None = None
    ) -> bytes:
        """A GET's body as received, not decoded (an informer times the apiserver and the decoding apart)."""
        return _body(self._send("GET", path, query, None, None, timeout, accept))

    def stream(
        self, path: str, *, query: Query | None = None, timeout: Timeout = None, accept: str | None = None
    ) -> WatchStream:
        """Open a streaming GET (a watch); the caller must `close()` the returned stream."""
        response = self._send("GET", path, query, None, None, timeout, accept)
        try:
            _raise_for_status(response)
        except BaseException:
            response.response.release_conn()
            raise
        return WatchStream(response)

    # -- typed helpers ---------------------------------------------------------------------------

    def get(
        self, resource: Resource, name: str, namespace: str | None = None, *, timeout: Timeout = DEFAULT_TIMEOUT
    ) -> Obj:
        return self.request("GET", resource.object_path(name, namespace), timeout=timeout)

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Query | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> Obj:
        return self.request("GET", resource.collection_path(namespace), query=query, timeout=timeout)

    def create(
        self, resource: Resource, body: Obj, namespace: str | None = None, *, timeout: Timeout = DEFAULT_TIMEOUT
    ) -> Obj:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        return self.request("POST", resource.collection_path(namespace), body=body, timeout=timeout)

    def replace(
        self, resource: Resource, body: Obj, *, subresource: str | None = None, timeout: Timeout = DEFAULT_TIMEOUT
    ) -> Obj:
        """PUT the whole object; its `metadata.resourceVersion` makes it conditional (409 if stale)."""
        metadata = body["metadata"]
        path = resource.object_path(metadata["name"], metadata.get("namespace"), subresource)
        return self.request("PUT", path, body=body, timeout=timeout)

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
        query: Query | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> dict[str, Any]:
        path = resource.object_path(name, namespace, subresource)
        return self.request("PATCH", path, body=patch, content_type=content_type, query=query, timeout=timeout)

    def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> dict[str, Any]:
        body = None
        if resource_version is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": resource_version}}
        return self.request("DELETE", resource.object_path(name, namespace), body=body, timeout=timeout)
