"""Live objects against `dbprovider render`: what the real-CLI tests compare after `pulumi up` and `destroy`.

The live object must carry every field of the render (the apiserver may add defaults) and exactly the
render's annotations plus those the test-only wrapper program adds (program/__main__.py), and no other.
"""

from __future__ import annotations

from typing import Any

from infra.render import object_key
from tests.support.kubeapi import KubeApi

# What the test-only wrapper program adds (tests/pulumi/program/__main__.py), and nothing else.
NODELESS = {"pulumi.com/deletionPropagationPolicy": "background"}
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
AWAITED_KINDS = {"Deployment", "Service"}
Key = tuple[str, str, str, str]


def live(api: KubeApi, obj: dict[str, Any]) -> dict[str, Any] | None:
    response = api.get(obj)
    if response.status == 404:
        return None
    assert response.status == 200, f"GET {object_key(obj)}: {response.status} {response.message}"
    return response.body


def differences(want: Any, have: Any, path: str = "") -> list[str]:
    """Where `have` (a live object) does not carry `want` (the render): apiserver defaults may add fields."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return [f"{path}: {have!r} is not an object"]
        found = []
        for key, value in want.items():
            if key not in have:
                found.append(f"{path}.{key}: missing")
            else:
                found.extend(differences(value, have[key], f"{path}.{key}"))
        return found
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return [f"{path}: {have!r} != {want!r}"]
        return [d for i, (w, h) in enumerate(zip(want, have, strict=True)) for d in differences(w, h, f"{path}[{i}]")]
    return [] if want == have else [f"{path}: {have!r} != {want!r}"]


def assert_live_equals_render(api: KubeApi, rendered: list[dict[str, Any]]) -> None:
    problems = []
    for obj in rendered:
        found = live(api, obj)
        if found is None:
            problems.append(f"{object_key(obj)}: not on the apiserver")
            continue
        annotations = dict(obj["metadata"].get("annotations") or {})
        annotations.update(NODELESS)
        if obj["kind"] in AWAITED_KINDS:
            annotations.update(SKIP_AWAIT)
        problems += [f"{object_key(obj)}{d}" for d in differences({**obj, "metadata": {}}, found)]
        meta = {k: v for k, v in obj["metadata"].items() if k != "annotations"}
        problems += [f"{object_key(obj)}{d}" for d in differences(meta, found["metadata"], ".metadata")]
        if (found["metadata"].get("annotations") or {}) != annotations:
            problems.append(f"{object_key(obj)}: annotations {found['metadata'].get('annotations')} != {annotations}")
    assert not problems, "live objects differ from `dbprovider render`:\n" + "\n".join(problems)


def versions(api: KubeApi, objects: list[dict[str, Any]]) -> dict[Key, tuple[str, str] | None]:
    """(uid, resourceVersion) of each object, None where it does not exist: any write changes it."""
    snapshot: dict[Key, tuple[str, str] | None] = {}
    for obj in objects:
        meta = (live(api, obj) or {}).get("metadata")
        snapshot[object_key(obj)] = (meta["uid"], meta["resourceVersion"]) if meta else None
    return snapshot
