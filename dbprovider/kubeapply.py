"""Server-side apply of rendered manifests, for `dbprovider dev` and the end-to-end tests.

Production installs go through `pulumi up` or GitOps; this is the same server-side apply for a
local control plane: CRDs first, then wait until they are Established, then everything else.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from domain.conditions import is_condition_true, object_conditions
from informers import Rest

FIELD_MANAGER = "dbprovider-dev"
APPLY_PATCH = "application/apply-patch+yaml"


class Applier:
    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._plurals:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for resource in self.rest.request("GET", prefix)["resources"]:
                if "/" not in resource["name"]:
                    self._plurals[(api_version, resource["kind"])] = (resource["name"], resource["namespaced"])
        if key not in self._plurals:
            raise LookupError(f"the apiserver serves no {api_version} {kind}")
        return self._plurals[key]

    def path(self, obj: dict[str, Any]) -> str:
        plural, namespaced = self._resource(obj["apiVersion"], obj["kind"])
        prefix = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        meta = obj["metadata"]
        collection = f"{prefix}/namespaces/{meta['namespace']}/{plural}" if namespaced else f"{prefix}/{plural}"
        return f"{collection}/{meta['name']}"

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.rest.request(
            "PATCH",
            self.path(obj),
            body=obj,
            content_type=APPLY_PATCH,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def apply_all(self, manifests: list[dict[str, Any]], timeout: float = 60.0) -> None:
        crds = [m for m in manifests if m["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            self.apply(crd)
        deadline = time.monotonic() + timeout
        for crd in crds:
            while not self._established(crd["metadata"]["name"]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {crd['metadata']['name']} not Established within {timeout:.0f}s")
                time.sleep(0.1)
        for obj in manifests:
            if obj["kind"] == "CustomResourceDefinition":
                continue
            while True:
                try:
                    self.apply(obj)
                    break
                except (LookupError, ApiException):
                    if time.monotonic() > deadline:  # discovery lags a just-established CRD briefly
                        raise
                    self._plurals.clear()
                    time.sleep(0.2)

    def _established(self, name: str) -> bool:
        try:
            crd = self.rest.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        except ApiException:
            return False
        return is_condition_true(object_conditions(crd), "Established")
