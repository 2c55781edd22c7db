"""A restarted replica says why its previous container ended (dbprovider.last_termination), read from its own Pod
on a real apiserver: the test writes the Pod's status as the kubelet would, through the status subresource."""

from __future__ import annotations

import prometheus_client
from kubernetes.client.exceptions import ApiException

from dbprovider.last_termination import EVENT_REASON, PODS, LastTermination
from domain.resources import Resource
from informers import EVENTS, Rest
from tests.support.common import unique, wait_for

METRIC = "dbprovider_manager_last_termination"
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")


def _pod(rest: Rest, namespace: str, last_state: dict | None) -> str:
    name = unique("manager")
    try:  # the Pod's ServiceAccount (no controller-manager here makes "default")
        rest.create(
            SERVICE_ACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}, namespace
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    spec = {"containers": [{"name": "manager", "image": "dbprovider:test"}], "automountServiceAccountToken": False}
    rest.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}, namespace)
    status = {
        "name": "manager",
        "image": "dbprovider:test",
        "imageID": "",
        "ready": False,
        "restartCount": 2 if last_state else 0,
        "state": {"running": {"startedAt": "2026-12-05T12:00:05Z"}},
        "lastState": last_state or {},
    }
    rest.patch(PODS, name, {"status": {"containerStatuses": [status]}}, namespace, subresource="status")
    return name


def test_an_oom_killed_container_is_reported_as_a_metric_and_an_event_on_the_pod(
    admin_rest: Rest, namespace: str
) -> None:
    terminated = {"reason": "OOMKilled", "exitCode": 137, "startedAt": "2026-12-05T11:00:00Z"}
    name = _pod(admin_rest, namespace, {"terminated": {**terminated, "finishedAt": "2026-12-05T12:00:00Z"}})
    registry = prometheus_client.CollectorRegistry()
    termination = LastTermination(admin_rest, registry, "test-replica").report(namespace, name)
    assert termination is not None and termination.oom and termination.restarts == 2
    assert registry.get_sample_value(METRIC, {"reason": "OOMKilled"}) == 1

    def event() -> dict | None:
        events = admin_rest.list(EVENTS, namespace)["items"]
        return next((e for e in events if e["involvedObject"]["name"] == name), None)

    found = wait_for(event, what="the Event on the Pod")
    assert found["reason"] == EVENT_REASON and found["type"] == "Warning"
    assert "OOMKilled" in found["message"] and "137" in found["message"] and "memory limit" in found["message"]


def test_a_first_start_reports_nothing(admin_rest: Rest, namespace: str) -> None:
    name = _pod(admin_rest, namespace, None)
    registry = prometheus_client.CollectorRegistry()
    assert LastTermination(admin_rest, registry, "test-replica").report(namespace, name) is None
    assert registry.get_sample_value(METRIC, {"reason": "OOMKilled"}) is None
    # Outside a Pod (no such Pod), nothing either, and no error.
    assert LastTermination(admin_rest, prometheus_client.CollectorRegistry(), "x").report(namespace, "absent") is None
