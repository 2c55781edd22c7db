"""Leader election on a real Lease: one leader at a time, fast hand-over on graceful stop,
takeover after a crash within the lease duration, and a leader that loses the lease (someone
else wrote it) steps down at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.settings import SETTINGS
from domain.version import __version__, parse_version
from harness import KubeControlPlane
from informers import LEASES, Rest
from informers.leader import LeaderMark
from reconciler.runtime import LeaderElector
from tests.runtime.support import follower_sees_renewals
from tests.support.common import unique, wait_for

LEASE, RENEW, RETRY = 2.0, 1.5, 0.25
REPO = Path(__file__).resolve().parents[2]


class Timeline:
    """Records when each elector started and stopped leading, to check for overlaps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[float, str, str]] = []

    def callbacks(self, who: str) -> dict:
        return {
            "on_started_leading": lambda: self._add(who, "start"),
            "on_stopped_leading": lambda: self._add(who, "stop"),
        }

    def _add(self, who: str, what: str) -> None:
        with self.lock:
            self.events.append((time.monotonic(), who, what))

    def of(self, who: str, what: str) -> list[float]:
        with self.lock:
            return [t for t, w, x in self.events if w == who and x == what]


@pytest.fixture
def electors(admin_rest: Rest, namespace: str) -> Iterator[list[LeaderElector]]:
    created: list[LeaderElector] = []
    yield created
    for elector in created:
        elector.stop(timeout=10)


def _elector(rest: Rest, namespace: str, name: str, identity: str, timeline: Timeline) -> LeaderElector:
    return LeaderElector(
        rest,
        namespace,
        name,
        identity=identity,
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
        **timeline.callbacks(identity),
    )


def _leader_and_follower(
    rest: Rest, namespace: str, electors: list[LeaderElector]
) -> tuple[Timeline, LeaderElector, LeaderElector]:
    """replica-a, leading the Lease "lock", and replica-b, started after it: (timeline, a, b)."""
    timeline = Timeline()
    a = _elector(rest, namespace, "lock", "replica-a", timeline)
    b = _elector(rest, namespace, "lock", "replica-b", timeline)
    electors.extend([a, b])
    a.start()
    assert a.wait_until_leading(10)
    b.start()
    return timeline, a, b


def test_only_one_leads_and_a_graceful_stop_hands_over_well_within_the_lease_duration(
    admin_rest: Rest, namespace: str, electors: list[LeaderElector]
) -> None:
    timeline, a, b = _leader_and_follower(admin_rest, namespace, electors)
    # Across several renewals, exactly one leads.
    follower_sees_renewals(a, b, 4)
    lease = admin_rest.get(LEASES, "lock", namespace)
    assert lease["spec"]["holderIdentity"] == "replica-a"
    # Replicas of this release read the real duration from the mark; older releases read the spec's
    # much longer one (they never take the Lease from this release: tests/upgrade/test_lease.py).
    assert LeaderMark.of(lease) == LeaderMark("replica-a", parse_version(__version__), 2)
    assert lease["spec"]["leaseDurationSeconds"] == round(SETTINGS.lease.older_release_wait)

    stopped_at = time.monotonic()
    a.stop()  # releases the lease
    assert not a.is_leading()
    assert b.wait_until_leading(LEASE)
    took = time.monotonic() - stopped_at
    assert took < LEASE / 2, f"hand-over took {took:.2f}s: the released lease should be taken at once"
    wait_for(lambda: timeline.of("replica-b", "start"))  # the callback runs in its own thread
    assert timeline.of("replica-a", "stop")[0] <= timeline.of("replica-b", "start")[0]
    lease = admin_rest.get(LEASES, "lock", namespace)
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 1


CHILD = textwrap.dedent(
    """
    import sys, threading, kubernetes.config
    from reconciler.runtime import LeaderElector
    api = kubernetes.config.new_client_from_config(config_file=sys.argv[1])
    lease, renew, retry = (float(v) for v in sys.argv[3:6])
    elector = LeaderElector(api, sys.argv[2], "lock", identity="child", lease_duration=lease,
                            renew_deadline=renew, retry_period=retry,
                            on_started_leading=lambda: print("LEADING", flush=True))
    elector.start()
    threading.Event().wait()
    """
)


def test_a_killed_leader_is_replaced_within_the_lease_duration(
    kube: KubeControlPlane, admin_rest: Rest, namespace: str, electors: list[LeaderElector], tmp_path: Path
) -> None:
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(kubeconfig), namespace, str(LEASE), str(RENEW), str(RETRY)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "LEADING"
        timeline = Timeline()
        survivor = _elector(admin_rest, namespace, "lock", "survivor", timeline)
        electors.append(survivor)
        survivor.start()
        wait_for(lambda: survivor._observed_spec is not None, what="the survivor to see the lease")
        assert not survivor.is_leading()

        child.send_signal(signal.SIGKILL)  # no release, no goodbye
        killed_at = time.monotonic()
        child.wait(10)
        assert survivor.wait_until_leading(LEASE + 2 * RETRY + 1.0)
        took = time.monotonic() - killed_at
        assert took <= LEASE + 2 * RETRY + 1.0
        assert took >= LEASE - RETRY * 2 - 0.1, f"took over after {took:.2f}s: before the lease could expire"
        assert admin_rest.get(LEASES, "lock", namespace)["spec"]["holderIdentity"] == "survivor"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_leader_whose_lease_was_taken_by_another_writer_stops_at_once(
    admin_rest: Rest, namespace: str, electors: list[LeaderElector]
) -> None:
    timeline = Timeline()
    a = _elector(admin_rest, namespace, "lock", "replica-a", timeline)
    electors.append(a)
    a.start()
    assert a.wait_until_leading(10)
    lease = admin_rest.get(LEASES, "lock", namespace)
    lease["spec"]["holderIdentity"] = "intruder"
    admin_rest.replace(LEASES, lease)
    written_at = time.monotonic()
    wait_for(lambda: timeline.of("replica-a", "stop"), timeout=RENEW + RETRY, what="replica-a to step down")
    assert timeline.of("replica-a", "stop")[0] - written_at <= 2 * RETRY + 0.5
    assert not a.is_leading()
    # It does not take the lease back before the intruder's lease expired.
    assert admin_rest.get(LEASES, "lock", namespace)["spec"]["holderIdentity"] == "intruder"


def test_a_deleted_lease_is_recreated_by_its_leader_and_the_follower_does_not_jump_in(
    admin_rest: Rest, namespace: str, electors: list[LeaderElector]
) -> None:
    """Seeing the Lease gone, a follower that saw it held waits for that lease to run out (the
    leader may still be leading until its next renewal); the leader re-creates it meanwhile."""
    timeline, a, b = _leader_and_follower(admin_rest, namespace, electors)
    wait_for(lambda: b._observed_spec is not None, what="the follower to see the lease")
    old_uid = admin_rest.get(LEASES, "lock", namespace)["metadata"]["uid"]
    admin_rest.delete(LEASES, "lock", namespace)
    wait_for(lambda: _holder(admin_rest, namespace) is not None, timeout=LEASE + 2, what="a new lease")
    assert _holder(admin_rest, namespace) == "replica-a"
    # Once b has read the new Lease renewed by a, its wait starts again: it can no longer jump in.
    follower_sees_renewals(a, b, 3, old_uid=old_uid)
    assert timeline.of("replica-b", "start") == [] and timeline.of("replica-a", "stop") == []


def _holder(rest: Rest, namespace: str) -> str | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return rest.get(LEASES, "lock", namespace)["spec"].get("holderIdentity")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_parameters_must_leave_room_for_a_safe_takeover(admin_rest: Rest) -> None:
    with pytest.raises(ValueError):
        LeaderElector(admin_rest, "ns", "lock", lease_duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError):
        LeaderElector(admin_rest, "ns", "lock", lease_duration=15, renew_deadline=2, retry_period=2)
    identity = LeaderElector(admin_rest, "ns", "lock").identity
    assert str(os.getpid()) in identity and identity != LeaderElector(admin_rest, "ns", "lock").identity
    assert unique("x") != unique("x")


def test_a_leader_renews_without_reading_the_lease_and_reads_it_when_someone_else_wrote(
    admin_rest: Rest, namespace: str, electors: list[LeaderElector]
) -> None:
    """Renewals are PUTs on the resourceVersion of the leader's own last write (no GET each time); a
    write by someone else in between (an annotation) makes that PUT fail, and the leader reads the
    Lease and renews it as usual: it keeps leading and the other writer's annotation stays."""
    timeline = Timeline()
    a = _elector(admin_rest, namespace, "lock", "replica-a", timeline)
    electors.append(a)
    a.start()
    assert a.wait_until_leading(10)
    reads: list[str] = []
    read = a.rest.get

    def counted_get(*args: object, **kwargs: object) -> dict:
        reads.append(str(args[1]))
        return read(*args, **kwargs)  # type: ignore[arg-type]

    a.rest.get = counted_get  # type: ignore[method-assign]

    def renewals(count: int) -> None:
        seen: set[str] = set()

        def more() -> bool:
            seen.add(admin_rest.get(LEASES, "lock", namespace)["spec"]["renewTime"])
            return len(seen) > count

        wait_for(more, timeout=count * RETRY * 3 + 2, what=f"{count} renewals", interval=0.02, max_interval=0.05)

    renewals(3)
    assert reads == []
    lease = admin_rest.get(LEASES, "lock", namespace)
    lease["metadata"].setdefault("annotations", {})["example.com/note"] = "an operator's"
    admin_rest.replace(LEASES, lease)
    wait_for(lambda: reads, timeout=RENEW, interval=0.05, what="the leader to read the changed Lease")
    renewals(2)
    assert a.is_leading() and timeline.of("replica-a", "stop") == []
    after = admin_rest.get(LEASES, "lock", namespace)
    assert after["spec"]["holderIdentity"] == "replica-a"
    assert after["metadata"]["annotations"]["example.com/note"] == "an operator's"
    assert reads == ["lock"]  # one read after the other write, none for the renewals since
