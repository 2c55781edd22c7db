"""The Kubernetes resources the API reads and writes.

The objects themselves are read typed: `api.models.read_database` (domain.objects.DatabaseObject) at
the boundary, domain.metadata's cheap accessors where a whole parse per event would be the cost.
"""

from __future__ import annotations

from domain.resources import CONSUMERS, DATABASES
from informers import SECRETS

__all__ = ["CONSUMERS", "DATABASES", "SECRETS"]
