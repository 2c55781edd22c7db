"""Helpers for the runtime suite: a small CRD of our own, objects, an event recorder."""

from __future__ import annotations

from typing import Any

from informers import Resource, Rest
from reconciler.runtime import LeaderElector
from tests.support.common import wait_for

GROUP = "runtime-test.dbprovider.example"
WIDGETS = Resource(GROUP, "v1", "widgets")
CRD_NAME = f"widgets.{GROUP}"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def ensure_crd(rest: Rest) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        rest.create(CRDS, CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = rest.get(CRDS, CRD_NAME)
        conditions = (crd.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
        try:
            rest.list(WIDGETS, "default", query=[("limit", "1")])
        except ApiException:
            return False
        return True

    wait_for(established, timeout=30, interval=0.1, what="the Widget CRD")


def widget(name: str, namespace: str, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec or {},
    }


def configmap(
    name: str, namespace: str, data: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "data": data or {},
    }


class Recorder:
    """An informer event handler that records (event_type, key, resourceVersion)."""

    def __init__(self) -> None:
        import threading

        self.events: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, event_type: str, old: dict | None, new: dict | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        md = obj["metadata"]
        key = f"{md.get('namespace')}/{md['name']}" if md.get("namespace") else md["name"]
        with self._lock:
            self.events.append((event_type, key, md.get("resourceVersion")))

    def for_key(self, key: str) -> list[str]:
        with self._lock:
            return [t for t, k, _ in self.events if k == key]

    def snapshot(self) -> list[tuple[str, str, str | None]]:
        with self._lock:
            return list(self.events)


def follower_sees_renewals(
    leader: LeaderElector, follower: LeaderElector, renewals: int, *, old_uid: str | None = None, timeout: float = 30
) -> None:
    """Wait until `follower` has read `renewals` renewals of the Lease by `leader`, checking at every
    poll that the leader leads and the follower does not.

    The positive signal that the follower was trying all along (it reads the Lease on every
    attempt) and left a live lease alone. With `old_uid`, only renewals of a Lease created again
    after that one count.
    """
    seen: set[str] = set()

    def enough() -> bool:
        assert (leader.is_leading(), follower.is_leading()) == (True, False)
        lease = follower._lease  # the Lease as the follower last read it
        if lease is not None and lease.spec.holder_identity == leader.identity and lease.metadata.uid != old_uid:
            seen.add(lease.spec.renew_time)
        return len(seen) >= renewals

    wait_for(enough, timeout, f"{follower.identity} to see {renewals} renewals by {leader.identity}")
