"""The connection budget arithmetic (domain.connection_budget): what a server allows, what a database
commits, what fits."""

from __future__ import annotations

import pytest

from domain.config import ConfigError, load_install_config
from domain.connection_budget import (
    Commitments,
    ServerSlots,
    budget,
    database_limit,
    databases_available,
    fits,
    provider_sessions,
)

DISABLED = {"type": "TenantDisabled", "status": "True", "reason": "Disabled", "message": ""}
NOT_DISABLED = {**DISABLED, "status": "False"}

CONFIG = load_install_config(
    {"tls": {"secretName": "t"}, "sizeClasses": {"large": {"connectionLimit": 50}}, "connectionLimit": {"default": 10}}
)


def test_the_budget_is_what_ordinary_roles_may_use_minus_the_provider_and_the_reserve() -> None:
    slots = ServerSlots(max_connections=200, superuser_reserved=3, reserved=5)
    assert slots.for_ordinary_roles == 192
    assert provider_sessions(4) == 9  # an admin session and a drop's second one per worker, and the check
    assert budget(slots, provider_sessions(4), reserved=5) == 178
    assert budget(ServerSlots(10, 3), provider=9, reserved=5) == 0  # never below 0
    # Overcommitted (a pooled shard): only the tenants' part is multiplied, rounded down.
    assert budget(slots, provider_sessions(4), reserved=5, overcommit=1.5) == 267
    assert budget(ServerSlots(10, 3), provider=9, reserved=5, overcommit=3) == 0


@pytest.mark.parametrize(
    ("max_databases", "count", "limit", "limits", "shard_budget", "expected"),
    [
        (100, 0, 10, [], 1000, 100),
        (100, 1, 10, [5], 1000, 99),  # a small one took 5: 99 more of 10
        (100, 0, 10, [], 183, 18),  # the budget bounds it
        (10, 8, 10, [], 1000, 2),  # maxDatabases bounds it
        (10, 12, 10, [], 1000, 0),  # a lowered maxDatabases: none, never negative
        (10, 0, 10, [200], 100, 0),  # overcommitted: none
        (10, 3, 0, [100], 100, 7),  # limit 0: only maxDatabases counts
        (10, 0, -1, [], 100, 1),  # unlimited: one on an empty shard
        (10, 1, -1, [1], 100, 0),
    ],
)
def test_databases_available(
    max_databases: int, count: int, limit: int, limits: list[int], shard_budget: int, expected: int
) -> None:
    assert databases_available(max_databases, count, limit, Commitments.of(limits), shard_budget) == expected


def test_the_overcommit_ratio_is_per_shard_and_validated() -> None:
    base = {"tls": {"secretName": "t"}}
    config = load_install_config({**base, "connectionBudget": {"overcommit": {"pooled-1": 2.5, "pooled-2": 3}}})
    assert config.connection_budget.overcommit_of("pooled-1") == 2.5
    assert config.connection_budget.overcommit_of("pooled-2") == 3.0
    assert config.connection_budget.overcommit_of("other") == 1.0
    for ratio in (0.5, 11, "2", True, float("inf")):
        with pytest.raises(ConfigError) as refused:
            load_install_config({**base, "connectionBudget": {"overcommit": {"pooled-1": ratio}}})
        assert refused.value.problems[0][0].startswith("connectionBudget.overcommit"), refused.value.problems
    with pytest.raises(ConfigError):
        load_install_config({**base, "connectionBudget": {"overcommit": {"Not_A_Name": 2}}})


@pytest.mark.parametrize(
    ("limits", "new", "shard_budget", "expected"),
    [
        ([], 10, 10, True),
        ([5], 10, 10, False),
        ([5, 5], 0, 10, True),  # a database of limit 0 commits nothing
        ([], -1, 10, True),  # unlimited: only on an empty shard...
        ([1], -1, 10, False),
        ([-1], 1, 10, False),  # ...and nothing beside it
        ([-1], 0, 10, True),
        ([None, 10], 0, 10, True),  # a database that commits nothing (Deleted, unknown class)
        ([], 1, None, False),  # budget not read yet
        ([], 1, 0, False),
    ],
)
def test_fits(limits: list[int | None], new: int, shard_budget: int | None, expected: bool) -> None:
    assert fits(new, Commitments.of(limits), shard_budget) is expected


def test_commitments_add_and_remove_and_count_an_unlimited_one_as_the_whole_budget() -> None:
    total = Commitments.of([10, -1, 5])
    assert total.total(100) == 115
    assert total.plus(-1, -1).plus(5, -1) == Commitments(10, 0)


@pytest.mark.parametrize(
    ("status", "spec", "expected"),
    [
        ({"appliedConnectionLimit": 7, "phase": "Ready"}, {"sizeClass": "large"}, 7),  # applied wins
        ({"phase": "Provisioning"}, {"sizeClass": "large"}, 50),  # not applied yet: its class
        ({}, {}, 10),  # no class: connectionLimit.default
        ({"phase": "Deleting", "appliedConnectionLimit": 3}, {}, 3),  # not disabled yet: its role may log in
        ({"phase": "Deleting", "appliedConnectionLimit": 3, "conditions": [DISABLED]}, {}, None),  # NOLOGIN
        ({"phase": "Ready", "appliedConnectionLimit": 3, "conditions": [NOT_DISABLED]}, {}, 3),  # recovered
        ({"phase": "Deleted", "appliedConnectionLimit": 3}, {}, None),  # dropped
        ({"phase": "Provisioning"}, {"sizeClass": "gone"}, None),  # a class the config no longer has
        ({"appliedConnectionLimit": -1}, {}, -1),
    ],
)
def test_what_a_database_commits(status: dict, spec: dict, expected: int | None) -> None:
    assert database_limit({"metadata": {"name": "x"}, "spec": spec, "status": status}, CONFIG) == expected
