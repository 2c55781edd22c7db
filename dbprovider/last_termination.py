"""Why this replica's container last ended, read from its own Pod at start.

A manager the kubelet killed (OOMKilled: its memory limit was too small for the fleet) and restarted would
otherwise start again in silence, load the same caches and be killed again. The kubelet records how the
previous container ended in the Pod's status (`containerStatuses[].lastState.terminated`: reason, exit code,
when), so at start the manager reads its own Pod (POD_NAME and POD_NAMESPACE from the downward API; RBAC: get
on pods of the release namespace) and reports it: the gauge `dbprovider_manager_last_termination{reason}`
(1 for the reason of the last end, none after a first start), a Warning Event `ContainerRestarted` on the
Pod (`kubectl describe pod` shows it), and a log line. docs/operations.md (DBProviderDown) says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import prometheus_client

from domain.resources import Resource
from informers import Rest
from reconciler.events import EventRecorder

log = logging.getLogger(__name__)

PODS = Resource("", "v1", "pods")
CONTAINER = "manager"  # the container's name in the Deployment (infra/templates/deployment.yaml.j2)
EVENT_REASON = "ContainerRestarted"
REQUEST_TIMEOUT = (5.0, 10.0)


@dataclass(frozen=True)
class Termination:
    """How the previous container ended: the kubelet's reason (OOMKilled, Error, Completed, ...)."""

    reason: str
    exit_code: int | None
    finished_at: str | None
    restarts: int

    def message(self) -> str:
        code = f" with exit code {self.exit_code}" if self.exit_code is not None else ""
        when = f" at {self.finished_at}" if self.finished_at else ""
        hint = " (over its memory limit: see resources.manager in the install config)" if self.oom else ""
        return f"container {CONTAINER} restarted ({self.restarts} restarts): it ended {self.reason}{code}{when}{hint}"

    @property
    def oom(self) -> bool:
        return self.reason == "OOMKilled"


def previous_termination(pod: Mapping[str, Any], container: str = CONTAINER) -> Termination | None:
    """The end of `container`'s previous run as the Pod's status records it; None after a first start."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if not isinstance(status, Mapping) or status.get("name") != container:
            continue
        terminated = (status.get("lastState") or {}).get("terminated")
        if not isinstance(terminated, Mapping):
            return None
        code = terminated.get("exitCode")
        restarts = status.get("restartCount")
        return Termination(
            reason=str(terminated.get("reason") or "Unknown"),
            exit_code=code if isinstance(code, int) else None,
            finished_at=terminated.get("finishedAt") if isinstance(terminated.get("finishedAt"), str) else None,
            restarts=restarts if isinstance(restarts, int) else 0,
        )
    return None


class LastTermination:
    """The gauge, registered at once (empty until a previous end is known), and `report`, run once at start."""

    def __init__(self, rest: Rest, registry: prometheus_client.CollectorRegistry, instance: str) -> None:
        self.rest = rest
        self.instance = instance
        self.gauge = prometheus_client.Gauge(
            "dbprovider_manager_last_termination",
            "1 for the reason the previous container of this replica ended (OOMKilled, Error, ...); no series "
            "after a first start.",
            ["reason"],
            registry=registry,
        )

    def report(self, namespace: str, pod_name: str) -> Termination | None:
        """Read the Pod and report its container's previous end; None when there is none or the read failed."""
        try:
            pod = self.rest.get(PODS, pod_name, namespace, timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a report only: the manager starts anyway
            level = logging.INFO if getattr(exc, "status", None) == 404 else logging.WARNING  # not run in a Pod
            log.log(level, "could not read this replica's Pod", extra={"pod": pod_name, "error": type(exc).__name__})
            return None
        termination = previous_termination(pod)
        if termination is None:
            return None
        self.gauge.labels(reason=termination.reason).set(1)
        log.warning(
            "this replica was restarted",
            extra={"reason": termination.reason, "exit_code": termination.exit_code, "restarts": termination.restarts},
        )
        events = EventRecorder(self.rest, self.instance, senders=1)
        events.record(pod, EVENT_REASON, termination.message(), warning=termination.reason != "Completed")
        events.close()
        return termination
