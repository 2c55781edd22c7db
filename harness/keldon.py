"""A stand-in for Keldon's `DatabaseCluster` CRD (keldon.io/v1alpha1), for tests and `dbprovider dev`.

The Keldon operator cannot run here, so nothing drives a cluster by itself: whoever creates a
DatabaseCluster plays the operator and sets `status.phase` through the status subresource. The schema
is minimal on purpose: what the provider reads (`status.phase`) and what tests change (`spec.segments`).
"""

from __future__ import annotations

from typing import Any

KELDON_CRD_NAME = "databaseclusters.keldon.io"

# Keldon's DatabaseCluster phases (seed: keldon-operations.txt); only Running allows placements.
RUNNING = "Running"
FAILED = "Failed"
NOT_RUNNING_PHASES = (
    "Pending",
    "PodsStarting",
    "SSHReady",
    "Initializing",
    "Scaling",
    "CoordinatorFailover",
    "Recovering",
)
ALL_PHASES = (*NOT_RUNNING_PHASES, RUNNING, FAILED)

KELDON_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": KELDON_CRD_NAME},
    "spec": {
        "group": "keldon.io",
        "scope": "Namespaced",
        "names": {
            "plural": "databaseclusters",
            "singular": "databasecluster",
            "kind": "DatabaseCluster",
            "listKind": "DatabaseClusterList",
            "shortNames": ["dbc"],
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Segments", "type": "integer", "jsonPath": ".spec.segments.count"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "segments": {
                                        "type": "object",
                                        "properties": {"count": {"type": "integer", "minimum": 1}},
                                    },
                                    "standby": {
                                        "type": "object",
                                        "properties": {"enabled": {"type": "boolean"}},
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string", "enum": list(ALL_PHASES)}},
                            },
                        },
                    }
                },
            }
        ],
    },
}
