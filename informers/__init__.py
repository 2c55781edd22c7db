"""Generic list+watch caches of Kubernetes objects as plain dicts, shared by API and controllers.

Of ours it depends on `domain` only (the shared contracts: timings from domain.settings); never on `api`,
`reconciler`, `infra`, `dbprovider` or `harness` (import-linter checks it).
"""

from informers.informer import ADDED, DELETED, MODIFIED, Informer, strip_managed_fields
from informers.named import NamedInformers
from informers.resource import CONFIGMAPS, EVENTS, LEASES, SECRETS, Resource, object_key, split_key
from informers.rest import MERGE_PATCH, Rest, WatchStream
from informers.shared import SharedInformers

__all__ = [
    "ADDED",
    "CONFIGMAPS",
    "DELETED",
    "EVENTS",
    "Informer",
    "LEASES",
    "MERGE_PATCH",
    "MODIFIED",
    "NamedInformers",
    "Resource",
    "Rest",
    "SECRETS",
    "SharedInformers",
    "WatchStream",
    "object_key",
    "split_key",
    "strip_managed_fields",
]
