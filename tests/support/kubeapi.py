"""A thin raw REST helper over the harness' ApiClient: server-side apply of arbitrary manifests.

Other suites can install the provider's objects the same way:

    with kube.admin_client() as client:
        apply_all(KubeApi(client), render_manifests(load_install_config({...})))

The generated typed client has no generic "apply this dict" call, so requests go through
`ApiClient.call_api`, with the REST path found by API discovery (cached, refreshed on a miss so freshly
created CRDs are found).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from tests.support.common import wait_for

FIELD_MANAGER = "dbprovider"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"


@dataclass
class Response:
    status: int
    body: Any

    @property
    def message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else str(self.body)


class KubeApi:
    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.base = api.configuration.host
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    # -- raw requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Response:
        url = f"{self.base}{path}"
        if query:
            url += "?" + urlencode(query)
        headers = {"Accept": accept}
        token = self.api.configuration.get_api_key_with_prefix("authorization")
        if token:  # bearer tokens (ServiceAccounts); client certificates authenticate in TLS
            headers["Authorization"] = token
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            response = self.api.call_api(method, url, header_params=headers, body=body)
            raw = response.read()
            status = response.status
        except ApiException as exc:
            raw, status = exc.body, exc.status
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode() if isinstance(raw, bytes) else raw
        return Response(status, parsed)

    def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = self.request(method, path, body, **kwargs)
        if not 200 <= response.status < 300:
            raise AssertionError(f"{method} {path}: {response.status} {response.message}")
        return response.body

    # -- paths ------------------------------------------------------------------------------------

    def _discover(self, api_version: str) -> None:
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        response = self.request("GET", prefix)
        if response.status != 200:
            return
        for resource in response.body["resources"]:
            if "/" not in resource["name"]:
                self._resources[(api_version, resource["kind"])] = (resource["name"], resource["namespaced"])

    def path(self, api_version: str, kind: str, namespace: str = "", name: str = "") -> str:
        key = (api_version, kind)
        if key not in self._resources:
            self._discover(api_version)
        if key not in self._resources:
            raise LookupError(f"the apiserver serves no {api_version} {kind}")
        plural, namespaced = self._resources[key]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
        return f"{path}/{name}" if name else path

    def object_path(self, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return self.path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])

    # -- verbs ------------------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> Any:
        """Server-side apply (`application/apply-patch+yaml`, force) of one manifest."""
        return self.ok(
            "PATCH",
            self.object_path(obj),
            obj,
            query={"fieldManager": field_manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> Response:
        meta = obj["metadata"]
        query = {"dryRun": "All"} if dry_run else None
        return self.request(
            "POST", self.path(obj["apiVersion"], obj["kind"], meta.get("namespace", "")), obj, query=query
        )

    def get(self, obj: dict[str, Any]) -> Response:
        return self.request("GET", self.object_path(obj))

    def merge_patch(self, obj: dict[str, Any], patch: dict[str, Any], subresource: str = "") -> Response:
        path = self.object_path(obj) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def delete(self, obj: dict[str, Any], *, dry_run: bool = False) -> Response:
        query = {"dryRun": "All"} if dry_run else None
        return self.request("DELETE", self.object_path(obj), query=query)


def crd_established(api: KubeApi, name: str) -> bool:
    response = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    if response.status != 200:
        return False
    conditions = (response.body.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def apply_all(api: KubeApi, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply CRDs, wait until Established, then apply everything else in order."""
    applied = []
    crds = [m for m in manifests if m["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        applied.append(api.apply(crd))
    for crd in crds:
        wait_for(lambda crd=crd: crd_established(api, crd["metadata"]["name"]), what=f"{crd['metadata']['name']}")
    for obj in manifests:
        if obj["kind"] != "CustomResourceDefinition":
            applied.append(wait_for(lambda obj=obj: _try_apply(api, obj), what=f"apply {obj['kind']}"))
    return applied


def _try_apply(api: KubeApi, obj: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return api.apply(obj)
    except LookupError:  # discovery not updated yet for a just-established CRD
        return None
