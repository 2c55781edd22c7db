"""Typed `metadata` of the Kubernetes objects the provider reads: the ObjectMeta fields it uses.

Parsed once where an object comes in (domain.objects), so code outside domain/ reads `meta.generation`
instead of `obj["metadata"].get("generation")`. Lenient as a reader must be: every field but the name is
optional, unknown fields (managedFields, ...) are ignored, and timestamps stay the strings the apiserver
sent (the API shows creationTimestamp as it is; deletionTimestamp only matters by being there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pydantic import Field, StrictBool, StrictInt, StrictStr

from domain.validation import SpecModel


class OwnerReference(SpecModel):
    """metav1.OwnerReference: who owns the object (the Database owns its credentials Secret)."""

    api_version: StrictStr
    kind: StrictStr
    name: StrictStr
    uid: StrictStr
    controller: StrictBool | None = None
    block_owner_deletion: StrictBool | None = None


class ObjectMeta(SpecModel):
    """The subset of metav1.ObjectMeta the provider reads."""

    name: StrictStr
    namespace: StrictStr | None = None
    uid: StrictStr | None = None
    generation: StrictInt | None = None
    resource_version: StrictStr | None = None
    creation_timestamp: StrictStr | None = None
    deletion_timestamp: StrictStr | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Self:
        """The metadata of a whole object (a Secret, a Deployment: kinds not modelled whole); ValidationError
        if it has none (the apiserver always sends one)."""
        return cls.model_validate(obj.get("metadata"))

    @property
    def key(self) -> str:
        """The informer's key: "namespace/name", or "name" for cluster-scoped objects."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def deleting(self) -> bool:
        """A Kubernetes delete was requested (the object waits for its finalizers)."""
        return bool(self.deletion_timestamp)

    def controlled_by(self, uid: str | None) -> bool:
        """True if the owner reference marked `controller` is the object with this uid."""
        return uid is not None and any(ref.uid == uid and ref.controller is True for ref in self.owner_references)


@dataclass(frozen=True)
class Identity:
    """What a document of unknown shape says it is (a landscape file under review), so a reader can name
    the document before it validates it: "" where a part is missing (or, but for the kind, not a string)."""

    api_version: str
    kind: str
    name: str
    namespace: str

    @classmethod
    def of(cls, doc: object) -> Identity:
        data = doc if isinstance(doc, Mapping) else {}
        meta = data.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        return cls(
            api_version=_text(data.get("apiVersion")),
            kind=str(data.get("kind", "")),  # shown as written, whatever it is: "the apiserver serves no ..."
            name=_text(meta.get("name")),
            namespace=_text(meta.get("namespace")),
        )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


# -- cheap accessors ---------------------------------------------------------------------------------
# For code that runs on every event of every object, or per object of a large list, where parsing the
# whole ObjectMeta would be the cost: each reads one field, typed, without validating the rest.


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def object_name(obj: Mapping[str, Any]) -> str | None:
    """`metadata.name` of an object; None unless a non-empty string (also for what did not parse)."""
    name = _meta(obj).get("name")
    return name if isinstance(name, str) and name else None


def object_annotation(obj: Mapping[str, Any], key: str) -> str | None:
    """One annotation of an object; None if it is not set (or the annotations are malformed)."""
    return _entry(obj, "annotations", key)


def object_label(obj: Mapping[str, Any], key: str) -> str | None:
    """One label of an object; None if it is not set (or the labels are malformed)."""
    return _entry(obj, "labels", key)


def _entry(obj: Mapping[str, Any], field: str, key: str) -> str | None:
    entries = _meta(obj).get(field)
    value = entries.get(key) if isinstance(entries, Mapping) else None
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ListPage:
    """One page of a LIST answer: its items (raw objects, parsed by whoever reads them) and the token of
    the next page (None on the last)."""

    items: list[dict[str, Any]]
    continue_token: str | None

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> ListPage:
        items = answer.get("items")
        token = _meta(answer).get("continue")
        return cls(items if isinstance(items, list) else [], token if isinstance(token, str) and token else None)
