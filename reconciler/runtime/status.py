"""Writing status through the status subresource, and Kubernetes-style conditions.

Choice: status is written with a JSON merge patch (RFC 7386) on `.../status` that carries the
resourceVersion of the object the reconcile read (`metadata.resourceVersion` in the patch is a
precondition: a stale read gives 409 Conflict, which the controller requeues as a conflict).
Why a patch and not a PUT: the body holds only what changed (a few hundred bytes instead of the
whole object) and spec/metadata can never be written back by mistake. Why the precondition:
merge patches replace lists whole, so without it two writers would silently overwrite each
other's `conditions`. Pass `resource_version=None` only for fields no one else writes.

A reconcile that changes nothing must write nothing: parse the object once (domain.objects), change
its typed status, then `write_status(rest, resource, obj)` writes only the difference from the status as
read (or nothing). `update_status` is the same for a status built as a dict.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from domain.metadata import ObjectMeta
from domain.objects import StatusOf
from domain.timefmt import format_time
from informers import Resource, Rest
from reconciler.runtime.controller import ensure_active


def now_rfc3339() -> str:
    return format_time(datetime.now(UTC))


# -- merge patches ---------------------------------------------------------------------------------


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch turning `old` into `new` ({} when equal).

    Nested objects are diffed, lists and scalars are replaced whole, removed keys become null.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(old[key], dict):
            sub = merge_patch(old[key], value)
            if sub:
                patch[key] = sub
        elif value != old[key]:
            patch[key] = copy.deepcopy(value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


# -- writing ---------------------------------------------------------------------------------------


def patch_status(
    rest: Rest,
    resource: Resource,
    name: str,
    status_patch: dict[str, Any],
    *,
    namespace: str | None = None,
    resource_version: str | None,
) -> dict[str, Any]:
    """Merge-patch `.status` of one object through the status subresource; returns the object.

    `resource_version` (keyword, required: choose) makes the write conditional: 409 if the object
    changed since it was read. Calls `ensure_active()` first: no writes once the controller stops.
    """
    ensure_active()
    body: dict[str, Any] = {"status": status_patch}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return rest.patch(resource, name, body, namespace, subresource="status")


def update_status(
    rest: Rest,
    resource: Resource,
    obj: dict[str, Any],
    desired_status: dict[str, Any],
    *,
    conditional: bool = True,
) -> dict[str, Any] | None:
    """Write `desired_status` for `obj` (as read from the cache) if it differs; else write nothing.

    Sends only the difference, conditional on obj's resourceVersion unless `conditional=False`.
    Returns the updated object, or None when nothing had to be written.
    """
    patch = merge_patch(obj.get("status") or {}, desired_status)  # the dict form: the status as stored
    if not patch:
        return None
    meta = ObjectMeta.model_validate(obj["metadata"])
    version = meta.resource_version if conditional else None
    return patch_status(rest, resource, meta.name, patch, namespace=meta.namespace, resource_version=version)


def write_status(rest: Rest, resource: Resource, obj: StatusOf[Any]) -> dict[str, Any] | None:
    """Write the typed status of `obj` (parsed from the cache, then changed) if it differs from the status
    as read; else write nothing. Conditional on the resourceVersion read; unknown stored keys are kept
    (domain.objects.status_body). Returns the updated object, or None when nothing had to be written.
    """
    patch = merge_patch(dict(obj.stored_status), obj.status_body())
    if not patch:
        return None
    meta = obj.metadata
    return patch_status(
        rest, resource, meta.name, patch, namespace=meta.namespace, resource_version=meta.resource_version
    )


def replace_status(rest: Rest, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """PUT the whole object to `.../status` (its resourceVersion is the precondition).

    Prefer `update_status`; this exists for callers that already hold a full, fresh object.
    """
    ensure_active()
    return rest.replace(resource, obj, subresource="status")
