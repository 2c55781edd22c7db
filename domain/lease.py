"""A coordination.k8s.io/v1 Lease, typed: what the leader election reads of it, parsed once per read.

The spec's times stay the MicroTime strings the apiserver sent (the elector only compares and rewrites
them). A Lease is written back from the model, built on the object as read: spec and metadata fields the
model does not know (a newer Kubernetes' spec.strategy or preferredHolder; uid, labels, ...) are kept, and
metadata.resourceVersion makes the PUT conditional.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, PrivateAttr, StrictInt, StrictStr

from domain.metadata import ObjectMeta
from domain.validation import SpecModel

API_VERSION = "coordination.k8s.io/v1"


class LeaseSpec(SpecModel):
    """coordination.k8s.io/v1 LeaseSpec (the fields leader election uses)."""

    holder_identity: StrictStr | None = None
    lease_duration_seconds: StrictInt | None = None
    acquire_time: StrictStr | None = None
    renew_time: StrictStr | None = None
    lease_transitions: StrictInt | None = None


class Lease(SpecModel):
    """A Lease as read (or about to be created), typed."""

    metadata: ObjectMeta
    spec: LeaseSpec = Field(default_factory=LeaseSpec)
    _stored: dict[str, Any] = PrivateAttr(default_factory=dict)  # the object as read: what `body` builds on

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """A Lease from the apiserver; a missing or null spec is an empty one (pydantic.ValidationError if
        a field has the wrong type, which the apiserver does not let happen)."""
        parsed = cls.model_validate({**obj, "spec": obj.get("spec") or {}})
        parsed._stored = dict(obj)
        return parsed

    @classmethod
    def new(cls, name: str, namespace: str) -> Self:
        """A Lease not created yet."""
        return cls(metadata=ObjectMeta(name=name, namespace=namespace))

    def with_spec(self, **fields: Any) -> Self:
        """A copy with these spec fields set, by their Python names."""
        unknown = fields.keys() - LeaseSpec.model_fields.keys()
        if unknown:
            raise TypeError(f"LeaseSpec has no field {', '.join(sorted(unknown))}")
        return self.model_copy(update={"spec": self.spec.model_copy(update=fields)})

    def body(self, annotations: Mapping[str, str]) -> dict[str, Any]:
        """The Lease to write (PUT or create) with these annotations: the object as read (without
        managedFields), its spec from the model, the fields the model does not know kept."""
        stored_meta = self._stored.get("metadata") or {}
        metadata = {key: value for key, value in stored_meta.items() if key != "managedFields"}
        metadata.update(name=self.metadata.name, annotations=dict(annotations))
        if self.metadata.namespace:
            metadata["namespace"] = self.metadata.namespace
        stored_spec = self._stored.get("spec") or {}
        known = {field.alias or name for name, field in LeaseSpec.model_fields.items()}
        spec = {key: value for key, value in stored_spec.items() if key not in known}
        spec.update(self.spec.model_dump(by_alias=True, exclude_none=True))
        return {"apiVersion": API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}
