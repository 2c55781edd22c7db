"""The connection budget arithmetic (domain.connection_budget): what a server allows, what a database
commits, what fits."""

from __future__ import annotations

import pytest

from domain.config import load_install_config
from domain.connection_budget import Commitments, ServerSlots, budget, database_limit, fits, provider_sessions

CONFIG = load_install_config(
    {"tls": {"secretName": "t"}, "sizeClasses": {"large": {"connectionLimit": 50}}, "connectionLimit": {"default": 10}}
)


def test_the_budget_is_what_ordinary_roles_may_use_minus_the_provider_and_the_reserve() -> None:
    slots = ServerSlots(max_connections=200, superuser_reserved=3, reserved=5)
    assert slots.for_ordinary_roles == 192
    assert provider_sessions(4) == 9  # an admin session and a drop's second one per worker, and the check
    assert budget(slots, provider_sessions(4), reserved=5) == 178
    assert budget(ServerSlots(10, 3), provider=9, reserved=5) == 0  # never below 0


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
        ({"phase": "Deleting", "appliedConnectionLimit": 3}, {}, 3),  # still holds its slots
        ({"phase": "Deleted", "appliedConnectionLimit": 3}, {}, None),  # dropped
        ({"phase": "Provisioning"}, {"sizeClass": "gone"}, None),  # a class the config no longer has
        ({"appliedConnectionLimit": -1}, {}, -1),
    ],
)
def test_what_a_database_commits(status: dict, spec: dict, expected: int | None) -> None:
    assert database_limit({"metadata": {"name": "x"}, "spec": spec, "status": status}, CONFIG) == expected
