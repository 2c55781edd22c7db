"""Two manager replicas: both keep their informers synced (the API reads them), only the leader
runs controllers; a leader that cannot renew (its RBAC revoked) stops reconciling before the
other replica starts; a graceful stop hands over at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import kubernetes.client
import pytest

from harness import KubeControlPlane
from informers import CONFIGMAPS, LEASES, Resource, Rest
from reconciler.runtime import Controller, ControllerManager, Result
from tests.runtime.support import configmap, follower_sees_renewals
from tests.support.common import unique, wait_for

LEASE, RENEW, RETRY = 2.0, 1.5, 0.25


class Replica:
    """One manager process' worth of machinery, as user `user`."""

    def __init__(self, kube: KubeControlPlane, namespace: str, user: str) -> None:
        self.user = user
        self.api = kube.client_as(user)
        self.manager = ControllerManager(
            self.api,
            lease_namespace=namespace,
            lease_name="manager",
            identity=user,
            lease_duration=LEASE,
            renew_deadline=RENEW,
            retry_period=RETRY,
            sync_timeout=10,
        )
        self.configmaps = self.manager.informers.informer(CONFIGMAPS, namespace)
        self.lock = threading.Lock()
        self.reconciles: list[tuple[float, str]] = []
        controller = Controller("noter", self.reconcile, workers=2)
        controller.watch(self.configmaps)
        self.controller = self.manager.add_controller(controller)
        self.after_stops = 0  # e.g. the provider closes its shards' admin sessions here
        self.manager.after_controllers_stop(self._after_stop)

    def _after_stop(self) -> None:
        assert not self.controller.running  # the hook runs once the controllers are down
        self.after_stops += 1

    def reconcile(self, key: str) -> Result:
        with self.lock:
            self.reconciles.append((time.monotonic(), key))
        return Result(requeue_after=0.05)  # keep reconciling: shows exactly when it stops

    def reconcile_times(self) -> list[float]:
        with self.lock:
            return [t for t, _ in self.reconciles]

    def close(self) -> None:
        self.manager.stop(timeout=10)
        self.api.close()


def _grant(kube: KubeControlPlane, namespace: str, user: str) -> None:
    with kube.admin_client() as admin:
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        for role, rules in (
            (
                "lease-rw",
                [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}],
            ),
            ("cm-read", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]),
        ):
            try:
                rbac.create_namespaced_role(namespace, {"metadata": {"name": role}, "rules": rules})
            except kubernetes.client.exceptions.ApiException as exc:
                if exc.status != 409:
                    raise
            rbac.create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {"name": f"{role}-{user}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                    "subjects": [{"kind": "User", "name": user}],
                },
            )


@pytest.fixture
def replicas(kube: KubeControlPlane, admin_rest: Rest, namespace: str) -> Iterator[tuple[Replica, Replica]]:
    users = (unique("rt-replica-a"), unique("rt-replica-b"))
    for user in users:
        _grant(kube, namespace, user)
    for i in range(3):
        admin_rest.create(CONFIGMAPS, configmap(f"obj-{i}", namespace))
    a, b = Replica(kube, namespace, users[0]), Replica(kube, namespace, users[1])
    yield a, b
    for replica in (a, b):
        replica.close()


def test_both_replicas_sync_their_informers_but_only_the_leader_reconciles(
    replicas: tuple[Replica, Replica], namespace: str
) -> None:
    a, b = replicas
    a.manager.start()
    wait_for(lambda: len(a.reconcile_times()) >= 3, what="the leader to reconcile")
    b.manager.start()
    assert b.configmaps.has_synced() and len(b.configmaps) == 3  # the API on B reads these
    assert a.manager.elector is not None and b.manager.elector is not None
    follower_sees_renewals(a.manager.elector, b.manager.elector, 3)  # B tried, saw A's live lease, stayed idle
    assert b.reconcile_times() == [] and not b.controller.running
    keys = {key for _, key in a.reconciles}
    assert keys == {f"{namespace}/obj-{i}" for i in range(3)}


def test_a_leader_that_cannot_renew_stops_reconciling_before_the_other_starts(
    kube: KubeControlPlane, replicas: tuple[Replica, Replica], namespace: str
) -> None:
    a, b = replicas
    a.manager.start()
    wait_for(lambda: a.manager.is_leading() and len(a.reconcile_times()) >= 3)
    b.manager.start()

    with kube.admin_client() as admin:  # revoke A's right to write the Lease
        kubernetes.client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding(f"lease-rw-{a.user}", namespace)
    revoked_at = time.monotonic()

    wait_for(lambda: not a.controller.running, timeout=RENEW + 2 * RETRY + 1, what="A to stop its controller")
    a_stopped_at = time.monotonic()
    assert a_stopped_at - revoked_at <= RENEW + 2 * RETRY + 1
    assert not a.manager.is_leading()
    assert a.manager.elector is not None
    assert getattr(a.manager.elector.last_error, "status", None) == 403  # the real cause is kept
    wait_for(lambda: a.after_stops == 1, what="A's after-stop hook (a lost Lease, not only a shutdown)")

    wait_for(lambda: b.manager.is_leading() and b.reconcile_times(), timeout=LEASE + 3, what="B to take over")
    a_last = max(a.reconcile_times())
    assert a_last <= a_stopped_at  # nothing reconciled by A once it stopped
    assert a_last < min(b.reconcile_times())  # and never both at once
    # B's requeues (every 0.05 s) mark the time passing: several of them, and still nothing from A.
    later = len(b.reconcile_times()) + 4
    wait_for(lambda: len(b.reconcile_times()) >= later, what="B to reconcile on")
    assert max(a.reconcile_times()) == a_last
    assert a.configmaps.has_synced()  # A's informers (and its API) keep serving
    assert b.after_stops == 0


def test_a_graceful_stop_releases_the_lease_and_the_other_replica_takes_over_at_once(
    replicas: tuple[Replica, Replica], admin_rest: Rest, namespace: str
) -> None:
    a, b = replicas
    a.manager.start()
    wait_for(lambda: a.manager.is_leading() and a.reconcile_times(), what="A to lead and reconcile")
    b.manager.start()
    stopped_at = time.monotonic()
    a.manager.stop()
    a_last = max(a.reconcile_times())
    wait_for(lambda: b.reconcile_times(), timeout=LEASE, what="B to reconcile")
    assert time.monotonic() - stopped_at < LEASE
    assert a_last < min(b.reconcile_times())
    assert admin_rest.get(LEASES, "manager", namespace)["spec"]["holderIdentity"] == b.user
    assert all(informer.stopped for informer in a.manager.informers.all())


def test_without_leader_election_controllers_run_as_soon_as_informers_synced(admin_rest: Rest, namespace: str) -> None:
    admin_rest.create(CONFIGMAPS, configmap("solo", namespace))
    manager = ControllerManager(admin_rest, lease_namespace=namespace, leader_election=False)
    seen: list[str] = []
    controller = Controller("solo", lambda key: seen.append(key) or Result())
    controller.watch(manager.informers.informer(CONFIGMAPS, namespace))
    manager.add_controller(controller)
    assert controller.metrics is manager.metrics
    manager.start()
    try:
        wait_for(lambda: seen == [f"{namespace}/solo"])
        assert manager.is_leading()
        with pytest.raises(RuntimeError):
            manager.add_controller(Controller("late", lambda key: None))
    finally:
        manager.stop()
    assert not controller.running


def test_start_fails_when_informers_cannot_sync(kube: KubeControlPlane, namespace: str) -> None:
    with kube.client_as(unique("rt-nobody")) as api:  # may list nothing
        manager = ControllerManager(api, lease_namespace=namespace, sync_timeout=1)
        manager.informers.informer(CONFIGMAPS, namespace)
        try:
            with pytest.raises(TimeoutError, match=r"configmaps.*HTTP 403: not allowed to list and watch it"):
                manager.start()
            assert manager.elector is not None and not manager.elector.is_leading()
        finally:
            manager.stop()


def test_start_names_a_missing_crd(kube: KubeControlPlane, namespace: str) -> None:
    """E.g. engines.cloudberry.enabled without Keldon installed: the error says what to fix."""
    with kube.admin_client() as api:
        manager = ControllerManager(api, lease_namespace=namespace, sync_timeout=2)
        manager.informers.informer(Resource("keldon.example.com", "v1", "databaseclusters"))
        try:
            with pytest.raises(TimeoutError, match=r"databaseclusters.*is its CustomResourceDefinition installed\?"):
                manager.start()
        finally:
            manager.stop()


def test_max_backoff_caps_the_retry_delay_of_every_controller(admin_rest: Rest, namespace: str) -> None:
    """What the alert tests rely on: with the cap at 2 s a failing key is retried every 2 s (not 1, 2, 4, 8...)."""
    admin_rest.create(CONFIGMAPS, configmap("failing", namespace))
    manager = ControllerManager(admin_rest, lease_namespace=namespace, leader_election=False, max_backoff=2.0)
    attempts: list[float] = []

    def reconcile(key: str) -> Result:
        attempts.append(time.monotonic())
        raise RuntimeError("always fails")

    controller = Controller("failing", reconcile)
    controller.watch(manager.informers.informer(CONFIGMAPS, namespace))
    manager.add_controller(controller)
    manager.start()
    try:
        # Uncapped, the sixth attempt comes 31 s after the first; capped, after 1 + 4 * 2 = 9 s.
        wait_for(lambda: len(attempts) >= 6, timeout=20)
    finally:
        manager.stop()
    assert attempts[5] - attempts[0] < 15
    assert max(b - a for a, b in zip(attempts, attempts[1:], strict=False)) < 3


def test_a_renewal_past_the_renew_deadline_keeps_the_lease_and_resyncs_every_key(
    replicas: tuple[Replica, Replica], namespace: str
) -> None:
    """The process was paused past its renew deadline (simulated by ageing the last renewal): the
    late renewal keeps the lease, the controllers keep running and every key is reconciled again."""
    a, _ = replicas
    a.manager.start()
    elector = a.manager.elector
    assert elector is not None
    wait_for(lambda: a.manager.is_leading() and len(a.reconcile_times()) >= 3, what="A to lead")
    reconciled_before = len(a.reconciles)
    elector._last_renew -= RENEW + RETRY  # as after a pause: is_leading() turns False at once
    assert not a.manager.is_leading()
    with pytest.raises(Exception, match="does not hold the Lease"):
        a.manager.fence()
    wait_for(lambda: elector.resumptions == 1, timeout=RENEW, what="the late renewal")
    assert a.manager.is_leading()
    a.manager.fence()  # writes are allowed again
    assert a.controller.running and a.after_stops == 0  # no stop: the lease was never lost
    every_key = {f"{namespace}/obj-{i}" for i in range(3)}
    # Each key comes back on its own 50 ms requeue, so four reconciles need not name all three (one key may
    # come twice first, as a cold CI run once saw): wait for the set itself.
    wait_for(
        lambda: {key for _, key in a.reconciles[reconciled_before:]} == every_key, what="every key reconciled again"
    )


def test_the_fenced_client_sends_no_write_without_the_lease(
    replicas: tuple[Replica, Replica], admin_rest: Rest, namespace: str
) -> None:
    a, _ = replicas
    fenced = admin_rest.fenced(a.manager.fence)  # an admin could write: only the fence stops it
    with pytest.raises(Exception, match="does not hold the Lease"):  # not started: not leading
        fenced.create(CONFIGMAPS, configmap("fenced-write", namespace))
    assert fenced.list(CONFIGMAPS, namespace)["items"]  # reads are never fenced
    names = {cm["metadata"]["name"] for cm in admin_rest.list(CONFIGMAPS, namespace)["items"]}
    assert "fenced-write" not in names
