"""The Lease, typed for leader election: read once, written back with what the model does not know kept."""

from __future__ import annotations

from domain.constants import ANNOTATION_LEADER
from domain.lease import Lease, LeaseSpec
from informers.leader import LeaderMark, lease_holder

STORED = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {
        "name": "dbprovider",
        "namespace": "dbprovider",
        "uid": "u1",
        "resourceVersion": "41",
        "labels": {"app": "dbprovider"},
        "annotations": {"note": "kept"},
        "managedFields": [{"manager": "kube-controller-manager"}],
    },
    "spec": {
        "holderIdentity": "replica-a",
        "leaseDurationSeconds": 600,
        "acquireTime": "2026-12-01T10:00:00.000001Z",
        "renewTime": "2026-12-01T10:00:02.000001Z",
        "leaseTransitions": 3,
        "strategy": "OldestEmulationVersion",  # a newer Kubernetes' field
    },
}


def test_a_lease_reads_typed() -> None:
    lease = Lease.parse(STORED)
    assert lease.spec == LeaseSpec(
        holder_identity="replica-a",
        lease_duration_seconds=600,
        acquire_time="2026-12-01T10:00:00.000001Z",
        renew_time="2026-12-01T10:00:02.000001Z",
        lease_transitions=3,
    )
    assert lease.metadata.resource_version == "41" and lease_holder(STORED) == "replica-a"
    assert Lease.parse({"metadata": {"name": "x"}, "spec": None}).spec == LeaseSpec()


def test_a_renewal_changes_what_it_sets_and_keeps_the_rest() -> None:
    renewed = Lease.parse(STORED).with_spec(renew_time="2026-12-01T10:00:04.000001Z")
    body = renewed.body({"note": "kept", ANNOTATION_LEADER: "{}"})
    assert body["spec"] == {**STORED["spec"], "renewTime": "2026-12-01T10:00:04.000001Z"}
    meta = {k: v for k, v in STORED["metadata"].items() if k != "managedFields"}
    assert body["metadata"] == {**meta, "annotations": {"note": "kept", ANNOTATION_LEADER: "{}"}}
    assert Lease.parse(STORED).spec.renew_time == "2026-12-01T10:00:02.000001Z"  # the one read is unchanged


def test_a_new_lease_has_only_what_was_set() -> None:
    body = Lease.new("lock", "ns").with_spec(holder_identity="me", lease_transitions=0).body({})
    assert body == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lock", "namespace": "ns", "annotations": {}},
        "spec": {"holderIdentity": "me", "leaseTransitions": 0},
    }


def test_a_released_mark_frees_the_lease_and_a_malformed_one_is_ignored() -> None:
    mark = LeaderMark("replica-a", (0, 2, 0), 15, released=True)
    released = {**STORED, "metadata": {**STORED["metadata"], "annotations": {ANNOTATION_LEADER: mark.annotation()}}}
    assert LeaderMark.of(released) == mark and lease_holder(released) is None
    odd = {**STORED, "metadata": {**STORED["metadata"], "annotations": {ANNOTATION_LEADER: "[1]"}}}
    assert LeaderMark.of(odd) is None and lease_holder(odd) == "replica-a"
