"""The leader Lease between releases: this release's elector against the previous release's own code.

The previous release's `LeaderElector` runs in a process of its own (its virtualenv, its source from
git); this release's runs here. Short timings: a lease of 2 s and an `older_release_wait` of 8 s.
What must hold during a rollout: no ping-pong, and an older replica never leads again once a newer
one has led, unless a rollback removes the Lease (docs/upgrade.md).
"""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import KubeControlPlane
from harness.releases import BuiltRelease
from informers import LEASES, Rest
from informers.leader import LeaderElector, lease_holder
from tests.support.common import unique, wait_for

LEASE, RENEW, RETRY = 2.0, 1.5, 0.25
OLDER_WAIT = 8.0

OLD_ELECTOR = textwrap.dedent(
    """
    import sys, threading
    import kubernetes
    from reconciler.runtime.leader import LeaderElector  # where the previous release has it

    kubeconfig, namespace, name, identity, lease, renew, retry = sys.argv[1:]
    client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    say = lambda what: print(what, flush=True)
    elector = LeaderElector(
        client, namespace, name, identity=identity, lease_duration=float(lease), renew_deadline=float(renew),
        retry_period=float(retry), on_started_leading=lambda: say("started"), on_stopped_leading=lambda: say("stopped"),
    )
    elector.start()
    sys.stdin.read()  # until the test closes stdin: then stop and release, as on SIGTERM
    elector.stop(timeout=10)
    say("exited")
    """
)


class OldElector:
    """The previous release's LeaderElector in its own process; `events` are its started/stopped lines."""

    def __init__(self, previous: BuiltRelease, kubeconfig: Path, namespace: str, name: str, identity: str) -> None:
        self.identity = identity
        self.events: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [
                str(previous.python),
                "-c",
                OLD_ELECTOR,
                str(kubeconfig),
                namespace,
                name,
                identity,
                str(LEASE),
                str(RENEW),
                str(RETRY),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=previous.env(),
            cwd=previous.root,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append((time.monotonic(), line.strip()))

    def started(self) -> list[float]:
        return [t for t, what in self.events if what == "started"]

    def leading(self) -> bool:
        states = [what for _, what in self.events if what in ("started", "stopped")]
        return bool(states) and states[-1] == "started"

    def stop(self) -> None:
        """Graceful: the previous release stops leading and releases the Lease (its way: empty holder)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture
def namespace(kube: KubeControlPlane) -> str:
    name = unique("lease")
    kube.ensure_namespace(name)
    return name


@pytest.fixture
def rest(kube: KubeControlPlane) -> Iterator[Rest]:
    with kube.admin_client() as client:
        yield Rest(client)


@pytest.fixture
def kubeconfig(kube: KubeControlPlane, tmp_path: Path) -> Path:
    return kube.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def started(previous: BuiltRelease) -> Iterator[list]:
    """Electors of both releases a test starts; all stopped afterwards."""
    created: list = []
    yield created
    for elector in created:
        if isinstance(elector, OldElector):
            elector.proc.kill()
            elector.proc.wait(timeout=10)
        else:
            elector.stop(release=False, timeout=10)


def _new(rest: Rest, namespace: str, identity: str, started: list, release: str | None = None) -> LeaderElector:
    extra = {} if release is None else {"release": release}
    elector = LeaderElector(
        rest,
        namespace,
        "lock",
        identity=identity,
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
        older_release_wait=OLDER_WAIT,
        **extra,
    )
    started.append(elector.start())
    return elector


def _old(previous: BuiltRelease, kubeconfig: Path, namespace: str, identity: str, started: list) -> OldElector:
    elector = OldElector(previous, kubeconfig, namespace, "lock", identity)
    started.append(elector)
    return elector


def _led_by_this_release(
    previous: BuiltRelease, kubeconfig: Path, rest: Rest, namespace: str, started: list
) -> tuple[LeaderElector, OldElector]:
    """A replica of this release leading ("new-0"), then one of the previous release ("old-0") beside it:
    where a rollout to this release stands once its first replica took over."""
    leader = _new(rest, namespace, "new-0", started)
    assert leader.wait_until_leading(10)
    return leader, _old(previous, kubeconfig, namespace, "old-0", started)


def _holder(rest: Rest, namespace: str) -> str | None:
    return lease_holder(rest.get(LEASES, "lock", namespace))


def _transitions(rest: Rest, namespace: str) -> int:
    return rest.get(LEASES, "lock", namespace)["spec"]["leaseTransitions"]


def test_an_older_leader_keeps_the_lease_while_a_newer_replica_waits_then_hands_over_at_once(
    previous: BuiltRelease, kubeconfig: Path, rest: Rest, namespace: str, started: list
) -> None:
    old = _old(previous, kubeconfig, namespace, "old-0", started)
    wait_for(old.leading, timeout=30, what="the previous release's replica to lead")
    new = _new(rest, namespace, "new-0", started)
    time.sleep(4 * LEASE)  # many renewals: the newer replica must not take a lease that is renewed
    assert not new.is_leading() and old.leading() and _holder(rest, namespace) == "old-0"
    transitions = _transitions(rest, namespace)

    stopped = time.monotonic()
    old.stop()  # the rolling update ends the old pod: it releases the Lease
    assert new.wait_until_leading(LEASE)
    assert time.monotonic() - stopped < LEASE, "a released Lease is taken at once"
    assert _transitions(rest, namespace) == transitions + 1  # one hand-over, no ping-pong


def test_an_older_replica_never_takes_the_lease_from_a_newer_one_alive_or_crashed(
    previous: BuiltRelease, kubeconfig: Path, rest: Rest, namespace: str, started: list
) -> None:
    first, old = _led_by_this_release(previous, kubeconfig, rest, namespace, started)
    second = _new(rest, namespace, "new-1", started)
    time.sleep(3 * LEASE)
    assert not old.started() and not second.is_leading()

    # The newer leader crashes (no release): the other newer replica takes over after the lease
    # duration; the older one does not.
    crashed = time.monotonic()
    first.stop(release=False)
    assert second.wait_until_leading(3 * LEASE)
    assert time.monotonic() - crashed < 2.5 * LEASE
    # The last newer replica crashes as well: the older one leads only after older_release_wait.
    time.sleep(LEASE)
    crashed = time.monotonic()
    second.stop(release=False)
    wait_for(old.leading, timeout=OLDER_WAIT + 10, what="the older replica to lead after older_release_wait")
    waited = old.started()[0] - crashed
    assert OLDER_WAIT - RETRY <= waited < OLDER_WAIT + 3 * RETRY + 2, waited
    assert len(old.started()) == 1


def test_a_released_lease_goes_at_once_to_this_release_and_to_an_older_one_only_after_the_wait(
    previous: BuiltRelease, kubeconfig: Path, rest: Rest, namespace: str, started: list
) -> None:
    leader, old = _led_by_this_release(previous, kubeconfig, rest, namespace, started)
    follower = _new(rest, namespace, "new-1", started)
    time.sleep(LEASE)

    stopped = time.monotonic()
    leader.stop()  # graceful: released for this release
    assert follower.wait_until_leading(LEASE)
    assert time.monotonic() - stopped < LEASE
    assert not old.started()

    # Now only the older replica is left and the newer one releases: the older one waits.
    stopped = time.monotonic()
    follower.stop()
    assert _holder(rest, namespace) is None  # released (the name stays for the older release's sake)
    wait_for(old.leading, timeout=OLDER_WAIT + 10, what="the older replica to lead")
    assert old.started()[0] - stopped >= OLDER_WAIT - RETRY


def test_a_rollback_frees_the_lease_once_no_replica_of_this_release_is_left(
    previous: BuiltRelease, kubeconfig: Path, rest: Rest, namespace: str, started: list
) -> None:
    """docs/upgrade.md, "Rolling back": the previous release's replicas come up beside this one's,
    this release's go; then the Lease's holder is cleared and an old replica leads at once."""
    leader, old = _led_by_this_release(previous, kubeconfig, rest, namespace, started)
    time.sleep(LEASE)
    leader.stop()  # the last replica of this release goes
    time.sleep(2 * LEASE)
    assert not old.started()
    rest.patch(LEASES, "lock", {"spec": {"holderIdentity": None}}, namespace)
    freed = time.monotonic()
    wait_for(old.leading, timeout=10, what="the older release to lead once the Lease is free")
    assert old.started()[0] - freed < 3 * RETRY + 1


def test_a_replica_waits_for_a_newer_release_as_the_previous_release_waits_for_this_one(
    rest: Rest, namespace: str, started: list
) -> None:
    """The rule is general: this release is the older one next to a later release."""
    newer = _new(rest, namespace, "newer-0", started, release="9.0.0")
    assert newer.wait_until_leading(10)
    this = _new(rest, namespace, "this-0", started)
    crashed = time.monotonic()
    newer.stop(release=False)
    assert this.wait_until_leading(OLDER_WAIT + 10)
    assert time.monotonic() - crashed >= OLDER_WAIT - RETRY
