"""The fleet gauges follow the cached objects and never carry tenant identifiers."""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, generate_latest

from domain.config import load_install_config
from domain.connection_budget import database_limit
from reconciler.fleet_metrics import FleetCollector

NOW = 1_800_000_000.0


def db(name: str, shard: str | None, phase: str | None, age: float = 0, **conditions: str) -> dict:
    from datetime import UTC, datetime

    created = datetime.fromtimestamp(NOW - age, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status: dict = {"conditions": [{"type": t, "status": s} for t, s in conditions.items() if t != "reason"]}
    if "reason" in conditions:
        status["conditions"].append({"type": "Ready", "status": "False", "reason": conditions["reason"]})
    if shard:
        status["shard"] = shard
    if phase:
        status["phase"] = phase
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"consumer": "consumer-secret-name", "externalId": "ext-secret-id"},
        "status": status,
    }


def condition(type_: str, status: str, reason: str, since: str = "2026-11-30T00:00:00Z") -> dict:
    """A condition as the Shard controller writes it (every field the CRD requires)."""
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": since}


SHARDS = [
    {
        "metadata": {"name": "s1"},
        "spec": {"maxDatabases": 10},
        "status": {"conditions": [condition("Ready", "True", "Ok")]},
    },
    {
        "metadata": {"name": "s2"},
        "spec": {"maxDatabases": 5},
        "status": {"conditions": [condition("Ready", "False", "Unreachable")]},
    },
]


def scrape(databases: list[dict]) -> str:
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: SHARDS, lambda: databases, clock=lambda: NOW))
    return generate_latest(registry).decode()


def test_gauges() -> None:
    text = scrape(
        [
            db("a", "s1", "Ready"),
            db("b", "s1", "Ready", ConnectionLimitDrift="True"),
            db("c", "s1", "Provisioning", age=120),
            db("d", None, None, age=30),
            db("e", "s2", "Deleting", DeletionHeld="True"),
            db("f", "s2", "Deleted"),
            db("g", None, "Failed", reason="NoCapacity"),
            db("h", None, "Failed", reason="NoCapacity"),
        ]
    )
    expected = [
        # No Ready condition yet: reason Unknown.
        'dbprovider_databases{phase="Ready",reason="Unknown",shard="s1"} 2.0',
        'dbprovider_databases{phase="Provisioning",reason="Unknown",shard="s1"} 1.0',
        'dbprovider_databases{phase="Provisioning",reason="Unknown",shard="unplaced"} 1.0',
        # On-call sees why: the Ready reason of Failed databases and of shards.
        'dbprovider_databases{phase="Failed",reason="NoCapacity",shard="unplaced"} 2.0',
        'dbprovider_shard_ready{reason="Ok",shard="s1"} 1.0',
        'dbprovider_shard_ready{reason="Unreachable",shard="s2"} 0.0',
        'dbprovider_shard_databases{shard="s1"} 3.0',
        'dbprovider_shard_databases{shard="s2"} 1.0',
        'dbprovider_shard_max_databases{shard="s2"} 5.0',
        'dbprovider_database_provisioning_oldest_seconds{shard="s1"} 120.0',
        'dbprovider_database_provisioning_oldest_seconds{shard="unplaced"} 30.0',
        'dbprovider_database_provisioning_oldest_seconds{shard="s2"} 0.0',
        'dbprovider_databases_deletion_held{shard="s2"} 1.0',
        'dbprovider_databases_connection_limit_drift{shard="s1"} 1.0',
    ]
    for line in expected:
        assert line in text, line
    assert "consumer-secret-name" not in text and "ext-secret-id" not in text


def test_connection_gauges_count_limits_against_the_recorded_budget() -> None:
    """Committed: the applied limit, else the size class's; an unlimited database commits the whole budget;
    Deleted ones nothing. No series for a shard whose budget was never read."""
    config = load_install_config({"tls": {"secretName": "t"}, "sizeClasses": {"large": {"connectionLimit": 50}}})
    shards = [
        {"metadata": {"name": "s1"}, "spec": {"maxDatabases": 10}, "status": {"connectionBudget": 120}},
        {"metadata": {"name": "s2"}, "spec": {"maxDatabases": 10}, "status": {"connectionBudget": 40}},
        {"metadata": {"name": "s3"}, "spec": {"maxDatabases": 10}, "status": {}},
    ]

    def placed(name: str, shard: str, phase: str, size_class: str = "", applied: int | None = None) -> dict:
        status: dict = {"shard": shard, "phase": phase}
        if applied is not None:
            status["appliedConnectionLimit"] = applied
        return {"metadata": {"name": name}, "spec": {"sizeClass": size_class}, "status": status}

    databases = [
        placed("a", "s1", "Ready", applied=50),
        placed("b", "s1", "Provisioning", size_class="large"),  # not applied yet: its class, 50
        placed("c", "s1", "Deleting", applied=10),  # still holds its slots
        placed("d", "s1", "Deleted", applied=10),  # dropped: nothing
        placed("e", "s2", "Ready", applied=-1),  # unlimited: the whole budget
        placed("f", "s3", "Ready", applied=5),
    ]
    registry = CollectorRegistry()
    registry.register(
        FleetCollector(
            lambda: shards,
            lambda: databases,
            clock=lambda: NOW,
            connection_limit=partial(database_limit, config=config),
        )
    )
    text = generate_latest(registry).decode()
    for line in (
        'dbprovider_shard_connection_budget{shard="s1"} 120.0',
        'dbprovider_shard_connections_committed{shard="s1"} 110.0',
        'dbprovider_shard_connection_budget{shard="s2"} 40.0',
        'dbprovider_shard_connections_committed{shard="s2"} 40.0',
    ):
        assert line in text, text
    assert not [line for line in text.splitlines() if "_shard_connection" in line and 'shard="s3"' in line]


def test_scaling_seconds_count_from_the_scaling_condition() -> None:
    """A cloudberry shard whose cluster began Scaling 30 minutes ago: 1800 s; every other shard: 0."""
    from datetime import UTC, datetime

    began = datetime.fromtimestamp(NOW - 1800, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    scaling = {
        "metadata": {"name": "cb1"},
        "spec": {"maxDatabases": 10, "engine": "cloudberry"},
        "status": {
            "conditions": [
                condition("Ready", "False", "ClusterScaling"),
                condition("Scaling", "True", "ClusterScaling", began),
            ]
        },
    }
    done = {
        "metadata": {"name": "cb2"},
        "spec": {"maxDatabases": 10, "engine": "cloudberry"},
        "status": {"conditions": [condition("Scaling", "False", "Ok", began)]},
    }
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: [*SHARDS, scaling, done], lambda: [], clock=lambda: NOW))
    text = generate_latest(registry).decode()
    assert 'dbprovider_shard_scaling_seconds{shard="cb1"} 1800.0' in text
    assert 'dbprovider_shard_scaling_seconds{shard="cb2"} 0.0' in text
    assert 'dbprovider_shard_scaling_seconds{shard="s1"} 0.0' in text
    assert 'dbprovider_shard_ready{reason="ClusterScaling",shard="cb1"} 0.0' in text


def test_engine_availability() -> None:
    from reconciler.fleet_metrics import EngineCollector

    available = {"cloudberry": False}
    registry = CollectorRegistry()
    registry.register(EngineCollector({"cloudberry": lambda: available["cloudberry"]}))
    assert 'dbprovider_engine_available{engine="cloudberry"} 0.0' in generate_latest(registry).decode()
    available["cloudberry"] = True
    assert 'dbprovider_engine_available{engine="cloudberry"} 1.0' in generate_latest(registry).decode()
