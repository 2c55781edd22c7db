"""Rolling the Deployments a claim names (`spec.rolloutDeployments`) when its Secret's values change.

The agent sets each one's pod template annotation `db.bnerd.com/credentials-version` to the Secret's:
a changed pod template is a rollout, done by the Deployment controller as any other (maxSurge,
maxUnavailable, the PodDisruptionBudget). It is a merge patch, and all the agent may do to a
Deployment: setting the value the template has already changes nothing, so a repeated patch (after a
failed status write) rolls nothing twice. A Deployment that is not there (404), or that the agent may
not patch (403: an RBAC of its own making), is reported, not an error retried: the Secret is written all
the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_CREDENTIALS_VERSION
from informers import Resource, Rest

DEPLOYMENTS = Resource("apps", "v1", "deployments")


@dataclass(frozen=True)
class Rollout:
    """The Deployments whose pod template now carries the version, those not found, those refused (403)."""

    rolled: tuple[str, ...]
    missing: tuple[str, ...]
    forbidden: tuple[str, ...] = ()


def template_patch(version: str) -> dict[str, object]:
    """The merge patch that puts `version` into a Deployment's pod template annotations."""
    return {"spec": {"template": {"metadata": {"annotations": {ANNOTATION_CREDENTIALS_VERSION: version}}}}}


def roll(rest: Rest, namespace: str, names: Iterable[str], version: str) -> Rollout:
    """Patch every Deployment `names` in `namespace` to `version`; other API errors are raised (retried)."""
    rolled: list[str] = []
    missing: list[str] = []
    forbidden: list[str] = []
    for name in names:
        try:
            rest.patch(DEPLOYMENTS, name, template_patch(version), namespace)
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            (missing if exc.status == 404 else forbidden).append(name)
        else:
            rolled.append(name)
    return Rollout(tuple(rolled), tuple(missing), tuple(forbidden))
