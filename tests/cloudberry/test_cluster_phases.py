"""A cloudberry Shard follows its Keldon DatabaseCluster's phase: only Running allows Ready."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness import PostgresServer
from informers import Rest
from tests.cloudberry.conftest import (
    FAILED,
    KELDON_NAMESPACE,
    NOT_RUNNING_PHASES,
    RUNNING,
    Fleet,
    condition,
    running_manager,
)


@dataclass
class Phased:
    fleet: Fleet
    cluster: str
    shard: str


@pytest.fixture(scope="module")
def phased(admin_rest: Rest, provider_client, pg15: PostgresServer) -> Iterator[Phased]:
    """One Running cluster with its shard and one manager, shared by the phase cases (each ends Running)."""
    fleet = Fleet(admin_rest)
    try:
        cluster = fleet.cluster(RUNNING)
        shard = fleet.cloudberry_shard(pg15, cluster)
        with running_manager(provider_client):
            fleet.wait_shard(shard, "Ok")
            yield Phased(fleet, cluster, shard)
    finally:
        fleet.cleanup()


def test_running_cluster_makes_the_shard_ready(phased: Phased) -> None:
    shard = phased.fleet.wait_shard(phased.shard, "Ok")
    assert condition(shard, "Ready")["status"] == "True"
    assert condition(shard, "Unreachable")["status"] == "False"
    assert shard["status"]["serverVersion"].startswith("15.")
    # Pre-16: CREATEROLE may manage any non-superuser role; the shard says so.
    weak = condition(shard, "WeakRoleIsolation")
    assert (weak["status"], weak["reason"]) == ("True", "ServerBefore16")


@pytest.mark.parametrize("phase", [p for p in NOT_RUNNING_PHASES if p != "Scaling"])
def test_every_other_phase_is_cluster_not_running(phased: Phased, phase: str) -> None:
    fleet = phased.fleet
    fleet.set_phase(phased.cluster, phase)
    shard = fleet.wait_shard(phased.shard, "ClusterNotRunning", f"(phase {phase})")
    ready = condition(shard, "Ready")
    assert ready["status"] == "False"
    assert ready["message"] == f"DatabaseCluster {KELDON_NAMESPACE}/{phased.cluster} is not Running (phase {phase})"
    # Not a connection or credentials problem: those conditions stay quiet.
    assert condition(shard, "Unreachable")["status"] == "False"
    assert condition(shard, "AdminAuthFailed")["status"] == "False"
    fleet.set_phase(phased.cluster, RUNNING)
    assert condition(fleet.wait_shard(phased.shard, "Ok"), "Ready")["status"] == "True"


def test_failed_cluster_has_its_own_message(phased: Phased) -> None:
    fleet = phased.fleet
    fleet.set_phase(phased.cluster, FAILED)
    ready = condition(fleet.wait_shard(phased.shard, "ClusterNotRunning", "has failed"), "Ready")
    assert ready["status"] == "False"
    assert ready["message"] == f"DatabaseCluster {KELDON_NAMESPACE}/{phased.cluster} has failed (phase Failed)"
    fleet.set_phase(phased.cluster, RUNNING)
    fleet.wait_shard(phased.shard, "Ok")


def test_missing_cluster_and_one_without_status(phased: Phased, pg15: PostgresServer) -> None:
    """A shard naming no existing cluster is not Ready; creating it (still without status) is not enough."""
    fleet = phased.fleet
    cluster = f"{phased.cluster}-later"
    shard = fleet.cloudberry_shard(pg15, cluster)
    ready = condition(fleet.wait_shard(shard, "ClusterNotRunning"), "Ready")
    assert ready["message"] == f"DatabaseCluster {KELDON_NAMESPACE}/{cluster} not found"

    fleet.cluster(None, name=cluster)  # as the operator has not written a status yet
    unknown = fleet.wait_shard(shard, "ClusterNotRunning", "(phase Unknown)")
    assert condition(unknown, "Ready")["message"] == (
        f"DatabaseCluster {KELDON_NAMESPACE}/{cluster} is not Running (phase Unknown)"
    )

    fleet.set_phase(cluster, RUNNING)
    fleet.wait_shard(shard, "Ok")

    # The cluster is deleted under a Ready shard.
    fleet.delete_cluster(cluster)
    ready = condition(fleet.wait_shard(shard, "ClusterNotRunning", "not found"), "Ready")
    assert ready["message"] == f"DatabaseCluster {KELDON_NAMESPACE}/{cluster} not found"
