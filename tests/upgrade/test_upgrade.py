"""From the previous release to this one and back, as docs/upgrade.md says, with nothing lost.

One flow on a control plane of its own (the tests run in order and build on each other):
1. the previous release (built from its commit) is installed from its own render, runs two
   replicas, and gets Databases in every phase (tests/upgrade/scenario.py);
2. this release's CRDs and the rest of its install are applied first, while the old replicas run;
3. the rolling update replaces one replica at a time; both releases run side by side meanwhile;
4. afterwards every Database kept its phase, placement and credentials, Ready ones ran only the SQL
   CHANGELOG.md announces, every token works, and the API answered every call of a client that
   polled it all along;
5. an old replica next to new ones (a rollout paused, a straggler) never leads and never writes;
6. the rollback to the previous release, as docs/upgrade.md says, works and loses nothing;
7. and the upgrade again after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain.resources import CONSUMERS, DATABASES, SHARDS
from domain.version import __version__
from harness.releases import BuiltRelease
from informers import LEASES
from tests.support.audit import leading_intervals
from tests.support.common import condition, wait_for
from tests.upgrade.history import History
from tests.upgrade.scenario import (
    TEAM_A,
    TEAM_B,
    TEAM_OFF,
    Case,
    Poller,
    World,
    credentials_of,
    kept,
    kubectl_get,
    mark_statement_logs,
    new_world,
    populate,
    release_rotation_blocker,
    set_accepting,
    unannounced_sql,
)
from tests.upgrade.stack import LEASE, NAMESPACE, ProcessCluster, Replica, Runtime, built_release, this_checkout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    created = ProcessCluster(tmp_path_factory.mktemp("upgrade")).start()
    try:
        yield created
    finally:
        created.close()


@pytest.fixture(scope="module")
def old(previous: BuiltRelease) -> Runtime:
    return built_release(previous)


@pytest.fixture(scope="module")
def new() -> Runtime:
    return this_checkout(__version__)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    made = new_world()
    yield made
    release_rotation_blocker(made)


class Run:
    """What the phases hand on to each other."""

    poller: Poller | None = None
    history: History | None = None
    crashed: set[str] = set()  # replicas killed on purpose (test 5): their in-flight answers failed


@pytest.fixture(scope="module")
def run(cluster: ProcessCluster) -> Iterator[type[Run]]:
    yield Run
    if Run.poller is not None:
        Run.poller.stop()
    if Run.history is not None:
        Run.history.stop()


def _failed_calls(cluster: ProcessCluster, run: type[Run]) -> list[str]:
    """The poller's calls that got no 200, except (a) those to a replica killed on purpose (test 5:
    a crash fails what it was answering) and (b) those sent less than a second before a replica of a
    release without a preStop delay (0.1.0) got SIGTERM: kube-proxy's lag sends such calls to a
    stopping pod, and 0.1.0's Deployment did not wait for that (this release's does, and gets none)."""
    replicas = {r.name: r for r in cluster.replicas}
    failed = []
    for sent, path, status, name in run.poller.failures():
        replica = replicas.get(name)
        if name in run.crashed:
            continue
        if (
            replica is not None
            and cluster.pre_stop.get(replica.runtime.version) == 0
            and replica.stopped_at is not None
            and -1.0 <= replica.stopped_at - sent <= 1.0
        ):
            continue
        failed.append(f"{path}: {status} from {name or 'no endpoint'}")
    return failed


def _wait_reason(cluster: ProcessCluster, case: Case, reason: str, timeout: float = 60) -> None:
    def reached() -> bool:
        db = cluster.rest.get(DATABASES, case.name, NAMESPACE)
        return (condition(db, "Ready") or {}).get("reason") == reason

    wait_for(reached, timeout, f"{case.external_id}: {reason}")


def _no_problems(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


def _wait_no_problems(check: Any, what: str, timeout: float = 120) -> None:
    last: list[str] = []

    def fine() -> bool:
        last[:] = check()
        return not last

    try:
        wait_for(fine, timeout, what)
    except AssertionError:
        raise AssertionError(f"{what}:\n" + "\n".join(last)) from None


def test_1_the_previous_release_runs_with_databases_in_every_phase(
    cluster: ProcessCluster, old: Runtime, world: World, run: type[Run]
) -> None:
    manifests = cluster.install(old)
    assert all("app.kubernetes.io/version" not in (m["metadata"].get("labels") or {}) for m in manifests)
    cluster.register(world.tokens, disabled=(TEAM_OFF,))
    cluster.start_replica(old)
    cluster.start_replica(old)
    populate(cluster, world)
    _no_problems(kept(cluster, world))
    assert set(kubectl_get(cluster, "v1alpha1")["databases"]) >= {c.name for c in world.cases.values()}
    with pytest.raises(AssertionError, match="HTTP 404"):
        kubectl_get(cluster, "v1beta1")  # the previous release serves v1alpha1 only
    run.history = History(cluster.rest, NAMESPACE).start()
    run.poller = Poller(cluster, world.tokens[TEAM_A], "ready-a1").start()


def test_2_the_crds_and_the_install_first_while_the_previous_release_runs(
    cluster: ProcessCluster, new: Runtime, world: World, run: type[Run]
) -> None:
    mark_statement_logs(cluster, world)
    manifests = cluster.install(new)  # CRDs first (Established), then RBAC, ConfigMap, Deployment...
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == __version__

    # Every kind lists in both versions, with the same columns and rows (what `kubectl get` shows).
    assert kubectl_get(cluster, "v1beta1") == kubectl_get(cluster, "v1alpha1")
    # The previous release keeps reconciling on the new CRDs: a database created now is handled by it.
    late = Case("after-crds", TEAM_B, "Failed", "NoCapacity")
    world.cases[late.external_id] = late
    assert cluster.call(world.tokens[TEAM_B], "PUT", "/v1/databases/after-crds", json={}).status == 201
    _wait_reason(cluster, late, "NoCapacity")
    late.status = cluster.rest.get(DATABASES, late.name, NAMESPACE)["status"]
    _no_problems(kept(cluster, world))
    _no_problems(_failed_calls(cluster, run))


def _leading_since(replica: Replica) -> list[datetime]:
    """When `replica` started leading, from its own log."""
    return [start for start, _ in leading_intervals(replica)]


def _handovers(replicas: list[Replica]) -> list[float]:
    """Seconds from each 'stopped leading' to the next 'started leading' of any replica."""
    events = sorted(
        (datetime.fromisoformat(e["time"].replace("Z", "+00:00")), e["message"].rsplit(": ", 1)[-1])
        for r in replicas
        for e in r.events()
        if e.get("message", "").endswith(("started leading", "stopped leading"))
    )
    gaps = []
    for (when, what), (later, next_what) in zip(events, events[1:], strict=False):
        if what == "stopped leading" and next_what == "started leading":
            gaps.append((later - when).total_seconds())
    return gaps


def _writes_by(cluster: ProcessCluster, replicas: list[Replica], after: datetime | None = None) -> list[str]:
    names = {r.name for r in replicas}
    return [
        f"{when.isoformat()} {who}: {what}"
        for when, who, what in cluster.controller_writes()
        if who in names and (after is None or when >= after)
    ]


def _ownership_confirmed(cluster: ProcessCluster, world: World) -> list[str]:
    """Ready databases (not held: a held one runs no SQL) whose OwnershipRecorded is not True yet."""
    waiting = []
    for case in world.ready():
        if "DeletionHeld" in case.conditions:
            continue
        db = cluster.rest.get(DATABASES, case.name, NAMESPACE)
        if (condition(db, "OwnershipRecorded") or {}).get("status") != "True":
            waiting.append(f"{case.external_id}: OwnershipRecorded not True yet")
    return waiting


def test_3_the_rolling_update_runs_both_releases_side_by_side_and_they_never_fight(
    cluster: ProcessCluster, old: Runtime, new: Runtime, world: World, run: type[Run]
) -> None:
    since = run.history.mark()
    old_replicas = cluster.running(old.version)
    old_leader = cluster.holder()
    assert old_leader in {r.name for r in old_replicas}

    def between(step: int) -> None:
        if step != 0:
            return
        # One new replica beside two old ones: it serves the API, but neither leads nor writes.
        (fresh,) = cluster.running(new.version)
        late = Case("via-new-api", TEAM_B, "Failed", "NoCapacity")
        world.cases[late.external_id] = late
        answer = cluster.call(world.tokens[TEAM_B], "PUT", "/v1/databases/via-new-api", json={}, replica=fresh)
        assert answer.status == 201, answer.body
        _wait_reason(cluster, late, "NoCapacity")  # reconciled by the previous release's leader
        late.status = cluster.rest.get(DATABASES, late.name, NAMESPACE)["status"]
        time.sleep(20)  # longer than a lease duration (15 s): the new replica must not take a renewed Lease
        assert cluster.holder() == old_leader
        assert not _writes_by(cluster, [fresh]), "a replica that does not lead wrote"

    rolling = time.monotonic()
    cluster.rolling_update(new, between)
    rolled = time.monotonic() - rolling
    new_replicas = cluster.running(new.version)
    assert len(new_replicas) == 2 and not cluster.running(old.version)
    wait_for(lambda: cluster.holder() in {r.name for r in new_replicas}, 60, "a new replica to lead")

    # The Lease changed hands at most once per old replica stopped, and never back to the old release.
    holders = run.history.lease_holders(since)
    first_new = next(i for i, h in enumerate(holders) if h in {r.name for r in new_replicas})
    assert not set(holders[first_new:]) & {r.name for r in old_replicas}, holders
    assert len(holders) <= 3, holders
    # No old controller wrote once a new replica led; no new one wrote before it led.
    took_over = min(t for r in new_replicas for t in _leading_since(r))
    assert not _writes_by(cluster, old_replicas, after=took_over + timedelta(seconds=1))
    for replica in new_replicas:
        led = _leading_since(replica)
        early = [w for w in _writes_by(cluster, [replica]) if not led or w < led[0].isoformat()]
        assert not early, early
    _wait_no_problems(lambda: _ownership_confirmed(cluster, world), "the ownership check of every Ready database")
    _no_problems(run.history.status_fights(since))
    _no_problems(_failed_calls(cluster, run))
    handovers = _handovers(old_replicas + new_replicas)
    print(
        f"\nupgrade: rolling update of 2 replicas in {rolled:.0f}s (20 s of it waiting beside the old leader); "
        f"Lease hand-overs {', '.join(f'{gap:.1f}s' for gap in handovers)} from 'stopped leading' to the next "
        "'started leading'"
    )


def test_4_after_the_upgrade_nothing_is_lost_and_everything_works(
    cluster: ProcessCluster, new: Runtime, world: World, run: type[Run]
) -> None:
    _no_problems(kept(cluster, world))
    _no_problems(unannounced_sql(cluster, world))
    legacy = cluster.rest.get(DATABASES, world.cases["legacy"].name, NAMESPACE)
    assert condition(legacy, "OwnershipRecorded")["reason"] == "Adopted"
    assert "TenantAdopted" in _event_reasons(cluster, world.cases["legacy"].name)
    for replica in cluster.running(new.version):
        assert f'version="{__version__}"' in replica.metrics()

    # The pending rotation goes through once the tenant lets go of its role.
    release_rotation_blocker(world)
    rotating = world.cases["rotating"]
    wait_for(
        lambda: (
            (condition(cluster.rest.get(DATABASES, rotating.name, NAMESPACE), "Ready") or {}).get("status") == "True"
        ),
        180,
        "the pending rotation to be applied",
    )
    _no_problems(kept(cluster, world, rotation_done=True))
    _refresh(cluster, world, rotating, "Ready", "Provisioned")

    # A Deleting database is recovered by this release with its credentials.
    deleting = world.cases["deleting"]
    cluster.rest.patch(
        DATABASES, deleting.name, {"metadata": {"annotations": {"db.bnerd.com/delete-requested-at": None}}}, NAMESPACE
    )
    wait_for(
        lambda: cluster.rest.get(DATABASES, deleting.name, NAMESPACE)["status"].get("phase") == "Ready",
        120,
        "the recovery of the Deleting database",
    )
    deleting.conditions = {}
    _refresh(cluster, world, deleting, "Ready", "Provisioned", keep_credentials=True)

    # Capacity again: the databases that found none are placed and provisioned by this release.
    set_accepting(cluster, True)
    for case in [c for c in world.cases.values() if c.phase == "Failed"]:
        wait_for(
            lambda c=case: cluster.rest.get(DATABASES, c.name, NAMESPACE)["status"].get("phase") == "Ready",
            180,
            f"{case.external_id}: placed once shards accept again",
        )
        _refresh(cluster, world, case, "Ready", "Provisioned")
    _create_ready(cluster, world, Case("after-upgrade", TEAM_A, "Ready", "Provisioned"))

    # The optional field 0.2.0 adds, written through the new version: shown, and harmless.
    cluster.rest.request(
        "PATCH",
        "/apis/db.bnerd.com/v1beta1/shards/upg-pg-a",
        body={"spec": {"description": "team databases, OPS-1"}},
        content_type="application/merge-patch+json",
    )
    cluster.rest.patch(CONSUMERS, TEAM_A, {"spec": {"description": "team A"}})
    assert "Description" in kubectl_get(cluster, "v1beta1")["shards"]
    _no_problems(kept(cluster, world))
    _no_problems(_failed_calls(cluster, run))


def _create_ready(cluster: ProcessCluster, world: World, case: Case) -> None:
    """A new database through the API, Ready, and kept from then on."""
    world.cases[case.external_id] = case
    answer = cluster.call(world.tokens[case.consumer], "PUT", f"/v1/databases/{case.external_id}", json={})
    assert answer.status == 201, answer.body
    wait_for(
        lambda: (cluster.rest.get(DATABASES, case.name, NAMESPACE).get("status") or {}).get("phase") == "Ready",
        120,
        f"{case.external_id}: Ready",
    )
    _refresh(cluster, world, case, "Ready", "Provisioned")


def _event_reasons(cluster: ProcessCluster, name: str) -> set[str]:
    items = cluster.rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return {e["reason"] for e in items if e["involvedObject"]["name"] == name}


def _refresh(
    cluster: ProcessCluster, world: World, case: Case, phase: str, reason: str, keep_credentials: bool = False
) -> None:
    """The case as it is now is what later phases must keep."""
    case.phase, case.reason = phase, reason
    case.status = cluster.rest.get(DATABASES, case.name, NAMESPACE)["status"]
    credentials = credentials_of(cluster, case)
    if keep_credentials:
        assert credentials == case.credentials
    case.credentials = credentials


def test_5_an_old_replica_beside_new_ones_never_leads_nor_writes(
    cluster: ProcessCluster, old: Runtime, new: Runtime, world: World, run: type[Run]
) -> None:
    """A replica of the previous release next to this one's (a paused rollout, a straggler pod)."""
    since = run.history.mark()
    straggler = cluster.start_replica(old)
    started = datetime.now(UTC)
    # Its API works: a database created through it is provisioned by the new leader.
    late = Case("via-old-api", TEAM_B, "Ready", "Provisioned")
    world.cases[late.external_id] = late
    answer = cluster.call(world.tokens[TEAM_B], "PUT", "/v1/databases/via-old-api", json={}, replica=straggler)
    assert answer.status == 201, answer.body
    wait_for(
        lambda: (cluster.rest.get(DATABASES, late.name, NAMESPACE).get("status") or {}).get("phase") == "Ready",
        120,
        "via-old-api: Ready",
    )
    _refresh(cluster, world, late, "Ready", "Provisioned")

    # The new leader crashes: the other new replica takes over; the old one does not.
    leader = next(r for r in cluster.running(new.version) if r.name == cluster.holder())
    crashed = time.monotonic()
    cluster.stop_replica(leader, kill=True)
    survivor = next(r for r in cluster.running(new.version))
    wait_for(lambda: cluster.holder() == survivor.name, 60, "the other new replica to lead")
    took = time.monotonic() - crashed
    time.sleep(20)
    assert cluster.holder() == survivor.name
    assert not _leading_since(straggler) and not _writes_by(cluster, [straggler], after=started)
    assert straggler.name not in run.history.lease_holders(since)
    cluster.stop_replica(straggler)
    cluster.start_replica(new)  # the Deployment replaces the crashed pod
    _no_problems(kept(cluster, world))
    _no_problems(run.history.status_fights(since))
    run.crashed.add(leader.name)
    _no_problems(_failed_calls(cluster, run))
    print(f"\nupgrade: a crashed new leader was replaced by the other new replica after {took:.1f}s")


def test_6_rolling_back_to_the_previous_release_as_the_docs_say(
    cluster: ProcessCluster, old: Runtime, new: Runtime, world: World, run: type[Run]
) -> None:
    """docs/upgrade.md, "Rolling back": apply the previous release's install (its CRDs, its
    Deployment: a rolling update back), then free the Lease once no replica of this release is left."""
    since = run.history.mark()
    mark_statement_logs(cluster, world)
    cluster.install(old)  # its CRDs: v1beta1 no longer served (storage stayed v1alpha1, so this is allowed)
    new_replicas = cluster.running(new.version)
    cluster.rolling_update(old)
    assert not cluster.running(new.version)
    with pytest.raises(AssertionError, match="HTTP 404"):
        kubectl_get(cluster, "v1beta1")
    # Nobody leads: the previous release waits for a newer release's Lease (older_release_wait)...
    time.sleep(20)
    assert not any(_leading_since(r) for r in cluster.running(old.version))
    # ...until the Lease is freed, as the docs say.
    cluster.rest.patch(LEASES, LEASE, {"spec": {"holderIdentity": None}}, NAMESPACE)
    freed = time.monotonic()
    wait_for(
        lambda: cluster.holder() in {r.name for r in cluster.running(old.version)},
        30,
        "an old replica to lead after the Lease was freed",
    )
    print(f"\nupgrade: after freeing the Lease an old replica led within {time.monotonic() - freed:.1f}s")
    assert not set(run.history.lease_holders(since)) - {r.name for r in new_replicas + cluster.running(old.version)}

    # What the new release wrote is accepted: phases, credentials, tokens, its condition kept.
    time.sleep(5)
    _no_problems(kept(cluster, world))
    legacy = cluster.rest.get(DATABASES, world.cases["legacy"].name, NAMESPACE)
    assert condition(legacy, "OwnershipRecorded")["reason"] == "Adopted"
    # Objects that carry the field this release added are read by the previous one.
    shard = cluster.rest.get(SHARDS, "upg-pg-a")
    assert (condition(shard, "Ready") or {}).get("status") == "True"
    # The previous release's CRD does not have the field: the apiserver does not show it (pruned on read).
    assert "description" not in shard["spec"]
    assert "description" not in cluster.rest.get(CONSUMERS, TEAM_A)["spec"]
    # Any write of an object while the previous release's CRDs are installed stores it without what
    # that CRD does not know (spec.description, the new Shard status fields). 0.1.0 writes every Shard's
    # and Consumer's status sooner or later; one write of our own to each makes that moment certain here
    # (whether 0.1.0 had written yet depended on the machine's load, and a value left stored until the
    # upgrade again would come back and go at the old leader's next write: a flap the history flags).
    for resource in (SHARDS, CONSUMERS):
        for obj in cluster.rest.list(resource)["items"]:
            labels = {"upgrade-test/written-after-rollback": "yes"}
            cluster.rest.patch(resource, obj["metadata"]["name"], {"metadata": {"labels": labels}})
    _no_problems(unannounced_sql(cluster, world))  # the previous release runs nothing on Ready ones
    _create_ready(cluster, world, Case("after-rollback", TEAM_A, "Ready", "Provisioned"))
    _no_problems(run.history.status_fights(since))
    _no_problems(_failed_calls(cluster, run))


def test_7_the_upgrade_again_after_the_rollback(
    cluster: ProcessCluster, new: Runtime, world: World, run: type[Run]
) -> None:
    since = run.history.mark()
    mark_statement_logs(cluster, world)
    cluster.install(new)
    cluster.rolling_update(new)
    wait_for(lambda: cluster.holder() in {r.name for r in cluster.running(new.version)}, 60, "a new replica to lead")
    _wait_no_problems(lambda: _ownership_confirmed(cluster, world), "the ownership check of every Ready database")
    # Both objects were written under the previous release's CRDs, which stored them without the field:
    # the value is gone, as docs/upgrade.md says (whoever set it sets it again; Flux does).
    assert "description" not in cluster.rest.get(SHARDS, "upg-pg-a")["spec"]
    assert "description" not in cluster.rest.get(CONSUMERS, TEAM_A)["spec"]
    assert kubectl_get(cluster, "v1beta1") == kubectl_get(cluster, "v1alpha1")
    _no_problems(kept(cluster, world))
    _no_problems(unannounced_sql(cluster, world))
    _no_problems(run.history.status_fights(since))
    run.poller.stop()
    _no_problems(_failed_calls(cluster, run))
    excused = len(run.poller.failures()) - len(_failed_calls(cluster, run))
    print(
        f"\nupgrade: the poller's {len(run.poller.answers)} calls were answered 200 except {excused} sent to a "
        "0.1.0 replica within a second of its SIGTERM (0.1.0 has no preStop delay) or to the crashed leader"
    )


def test_8_status_a_newer_release_writes_survives_this_releases_writes(cluster: ProcessCluster, world: World) -> None:
    """A later release adds a status field (its CRD has it): this release's status writes keep it
    (0.1.0's dropped such keys: tests/upgrade/test_status_keys.py)."""
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/databases.db.bnerd.com"
    crd = cluster.rest.request("GET", crd_path)
    for version in crd["spec"]["versions"]:  # what the next release's CRD would add
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        status["properties"]["nextReleaseField"] = {"type": "string", "description": "a newer release's"}
    cluster.rest.request("PUT", crd_path, body=crd)
    case = world.cases["ready-b1"]

    def written() -> bool:
        cluster.rest.patch(
            DATABASES, case.name, {"status": {"nextReleaseField": "kept"}}, NAMESPACE, subresource="status"
        )
        return cluster.rest.get(DATABASES, case.name, NAMESPACE)["status"].get("nextReleaseField") == "kept"

    wait_for(written, 30, "the newer release's field stored (the CRD change takes a moment)")
    before = cluster.rest.get(DATABASES, case.name, NAMESPACE)["status"]
    # A rotation makes this release write the status (passwordApplied, rotationApplied).
    assert (
        cluster.call(world.tokens[TEAM_B], "POST", "/v1/databases/ready-b1/credentials/rotate", json={}).status == 202
    )
    after = wait_for(
        lambda: (s := cluster.rest.get(DATABASES, case.name, NAMESPACE)["status"]).get("rotationApplied") and s,
        120,
        "the rotation to be applied",
    )
    assert after["passwordApplied"] != before["passwordApplied"]
    assert after.get("nextReleaseField") == "kept"
