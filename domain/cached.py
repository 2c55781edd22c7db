"""What the shared caches keep of each kind: the one table of the informers' transforms.

A manager holds every Database of its namespace, and each one's credentials Secret, for as long as it runs;
its memory grows by what it keeps of each. So the informers keep only the fields that the controllers and
the API read (client-go's transform functions do the same): whatever an object holds besides them
(managedFields, the `kubectl.kubernetes.io/last-applied-configuration` copy of an applied object, a Secret's
data, fields the apiserver or other tools add) is dropped before the store holds it. Strings that repeat
across objects of a kind (the namespace, a shard's name, a consumer's, condition reasons) are held once
(`sys.intern`) rather than once per object, and so are lists of them (the finalizers); a Database's uid and
password id, which its credentials Secret names too, are one string for both.

A Secret's data is never kept: the cache holds its name and version, `domain.credentials.secret_digest`, its
password id and its controller's uid (`cached_secret_summary`, flat: a fleet holds one per Database), which is
enough to decide that a credentials Secret is current (settled.py); whoever needs a value (the password for
SQL, the API's credentials) reads the Secret from the apiserver. Reading values from a cached Secret raises
(domain.credentials), so a reader that forgets does not see a Secret without data.

Objects kept by name (informers.named: the Consumers' token Secrets, whose hashes the API compares) are kept
whole but for their managedFields and LAST_APPLIED (`without_bookkeeping`).

A path is a tuple of keys from the object's root; it keeps everything under it. `*` stands for every item
of a list (and, in a `shared` path, every value of a mapping). tests/unit/test_cached.py runs the readers of
each kind on full and on cached objects and asserts they answer the same: a field read but dropped here
fails there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.constants import LABEL_CONSUMER
from domain.credentials import cached_secret_summary
from domain.resources import CONSUMERS, DATABASE_CLUSTERS, DATABASES, SHARDS, Resource

Path = tuple[str, ...]
Obj = dict[str, Any]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SECRETS = Resource("", "v1", "secrets")

# metav1.ObjectMeta as domain.metadata.ObjectMeta reads it (labels and annotations whole, less LAST_APPLIED).
_METADATA: tuple[Path, ...] = tuple(
    ("metadata", field)
    for field in (
        "name",
        "namespace",
        "uid",
        "generation",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
    )
)
_TYPE: tuple[Path, ...] = (("apiVersion",), ("kind",))
# lastTransitionTime too: the conditions one pass sets share it.
_CONDITIONS: tuple[Path, ...] = tuple(
    ("status", "conditions", "*", key) for key in ("type", "status", "reason", "message", "lastTransitionTime")
)


_Tree = dict[str, "_Tree | None"]  # None: the end of a path


def _tree(paths: tuple[Path, ...]) -> _Tree:
    tree: _Tree = {}
    for path in paths:
        node = tree
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if child is None:  # a shorter path keeps all of it already
                break
            node = child
        else:
            node[path[-1]] = None
    return tree


@dataclass
class _Node:
    """One place of a kind's object: `whole` keeps every key under it (else only `children`'s), `each` applies
    to every item of a list (or value of a whole mapping), `intern` holds a string (or a list of strings) once."""

    whole: bool = False
    intern: bool = False
    children: dict[str, _Node] = field(default_factory=dict)
    each: _Node | None = None


def _compile(kept: _Tree | None, shared: _Tree | None, *, interned: bool = False) -> _Node:
    """The node for a place `kept` (None: kept whole) whose shared paths below are `shared` (None: none)."""
    node = _Node(whole=kept is None, intern=interned)
    keys = set(kept or ()) | (set(shared or ()) if kept is None else set())
    for key in keys:
        below_kept = None if kept is None else kept[key]
        below_shared = (shared or {}).get(key)
        child = _compile(
            below_kept, below_shared, interned=shared is not None and key in shared and below_shared is None
        )
        if key == "*":
            node.each = child
        else:
            node.children[key] = child
    return node


# Lists of strings held once (a `shared` path to a list, such as the finalizers every Database has): a few
# distinct contents for the whole fleet, each held as one list that the objects share.
_HELD_LISTS: dict[tuple[str, ...], list[str]] = {}


def _held_once(value: Any) -> Any:
    """A string, or a list of strings, as one object for every equal value (read-only, as all cached objects)."""
    if type(value) is str:
        return sys.intern(value)
    if type(value) is list and all(type(item) is str for item in value):
        items = tuple(sys.intern(item) for item in value)
        held = _HELD_LISTS.get(items)
        return held if held is not None else _HELD_LISTS.setdefault(items, list(items))
    return value


def _walk(node: _Node, value: Any) -> Any:
    if node.intern:
        return _held_once(value)
    if type(value) is dict:
        if node.whole:
            for key, child in node.children.items():
                if key in value:
                    value[key] = _walk(child, value[key])
            if node.each is not None:
                for key in value:
                    value[key] = _walk(node.each, value[key])
            return value
        return {key: _walk(child, value[key]) for key, child in node.children.items() if key in value}
    if type(value) is list and node.each is not None:
        each = node.each
        if node.whole:
            return [_walk(each, item) for item in value]
        return [_walk(each, item) for item in value if type(item) is dict]
    return value


@dataclass(frozen=True)
class CachedForm:
    """What a cache keeps of one kind: `kept` paths (everything else is dropped), `shared` paths whose string
    values repeat across objects (held once), and `summary`: a function of the whole object whose keys are
    added to the kept one's top level (a Secret's digest, password id and owner, domain.credentials), or None."""

    kept: tuple[Path, ...]
    shared: tuple[Path, ...] = ()
    summary: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None
    _root: _Node = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_root", _compile(_tree(self.kept), _tree(self.shared)))

    def apply(self, obj: Obj) -> Obj:
        """The object as the cache keeps it: one walk over what is kept. `obj` (a decoded answer, owned by the
        caller) may be changed on the way; use the returned dict."""
        summary = self.summary(obj) if self.summary is not None else None
        kept: Obj = _walk(self._root, obj)
        annotations = (kept.get("metadata") or {}).get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            kept["metadata"]["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        if summary is not None:
            kept.update(summary)
        return kept


# kind (its resource) -> what its cache keeps. A kind not listed keeps all but managedFields.
CACHED: dict[Resource, CachedForm] = {
    DATABASES: CachedForm(
        kept=(*_TYPE, *_METADATA, ("spec",), ("status",)),
        shared=(
            *_TYPE,
            ("metadata", "namespace"),
            ("metadata", "finalizers"),
            ("metadata", "labels", LABEL_CONSUMER),
            ("spec", "consumer"),
            ("spec", "sizeClass"),
            ("spec", "engine"),
            ("status", "shard"),
            ("status", "phase"),
            ("status", "appliedSizeClass"),
            *_CONDITIONS,
            # Held by its credentials Secret's cached form too (cached_secret_summary): one string for both.
            ("metadata", "uid"),
            ("status", "passwordApplied"),
        ),
    ),
    SHARDS: CachedForm(kept=(*_TYPE, *_METADATA, ("spec",), ("status",)), shared=_TYPE),
    CONSUMERS: CachedForm(kept=(*_TYPE, *_METADATA, ("spec",), ("status",)), shared=_TYPE),
    DATABASE_CLUSTERS: CachedForm(kept=(*_TYPE, *_METADATA, ("spec",), ("status",)), shared=_TYPE),
    # Only credentials Secrets are cached whole-object (label-selected); other Secrets are read by name.
    SECRETS: CachedForm(
        kept=(("metadata", "name"), ("metadata", "namespace"), ("metadata", "resourceVersion")),
        shared=(("metadata", "namespace"),),
        summary=cached_secret_summary,
    ),
}


def cached_form(resource: Resource) -> Callable[[Obj], Obj]:
    """The informers' transform for `resource`: `CachedForm.apply` of its entry, or `without_bookkeeping`."""
    form = CACHED.get(resource)
    return form.apply if form is not None else without_bookkeeping


def without_bookkeeping(obj: Obj) -> Obj:
    """`obj` without its managedFields and its LAST_APPLIED annotation (in place): what a whole object kept by
    name (a Consumer's token Secret) does not need."""
    metadata = obj.get("metadata") or {}
    metadata.pop("managedFields", None)
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(LAST_APPLIED, None)
    return obj
