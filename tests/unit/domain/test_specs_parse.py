"""Objects are parsed once through domain.specs; the one-field accessor agrees with the model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from domain.constants import Engine
from domain.specs import database_consumer_name, parse_consumer, parse_database, parse_shard

SHARD = {
    "metadata": {"name": "a"},
    "spec": {
        "maxDatabases": 3,
        "accepting": False,
        "perconaCluster": {"namespace": "pg", "name": "a"},
        "admin": {"serviceName": "a-primary", "secretRef": {"namespace": "dbprovider", "name": "a"}},
        "client": {"host": "a.example.com"},
    },
}


def test_parse_reads_the_spec_of_an_object() -> None:
    spec = parse_shard(SHARD)
    assert (spec.engine, spec.accepting, spec.max_databases, spec.client.port) == (Engine.POSTGRES, False, 3, 5432)
    consumer = parse_consumer({"spec": {"tokenSecretRef": {"namespace": "dbprovider", "name": "c-token"}}})
    assert consumer.token_secret_ref.key == "sha256" and consumer.max_databases is None
    database = parse_database({"spec": {"consumer": "c", "externalId": "orders"}})
    assert (database.consumer, database.external_id, database.size_class) == ("c", "orders", "")


@pytest.mark.parametrize("obj", [{}, {"spec": None}, {"spec": {"maxDatabases": 0}}])
def test_an_invalid_or_missing_spec_raises(obj: dict) -> None:
    with pytest.raises(ValidationError):
        parse_shard(obj)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"spec": {"consumer": "c", "externalId": "x"}}, "c"),
        ({"spec": {"consumer": ""}}, None),
        ({"spec": {"consumer": 7}}, None),
        ({"spec": None}, None),
        ({}, None),
    ],
)
def test_consumer_accessor(obj: dict, expected: str | None) -> None:
    assert database_consumer_name(obj) == expected
