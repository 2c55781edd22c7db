"""CRD schemas generated from the domain models: structural, documented, and saying what the models say."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from domain.hosts import cel_host_rule
from domain.specs import CLAIM_CEL_RULES, SHARD_CEL_RULES, SSLMODES
from domain.status import ConsumerStatus, DatabaseClaimStatus, DatabaseMoveStatus, DatabaseStatus, ShardStatus
from infra.crds import CLAIM_KEY, SchemaError, claim_schema, crd_schemas, structural_schema

SCHEMAS = {**crd_schemas(), CLAIM_KEY: claim_schema()}


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schema_is_structural_and_documented(kind: str) -> None:
    for path, node in nodes(SCHEMAS[kind]):
        assert not {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title"} & set(node), path
        assert "type" in node, path
        if path != ".metadata":
            assert node.get("description"), f"{kind}{path} has no description"
        if "default" in node:
            assert node["default"] is not None, path


def spec(kind: str) -> dict[str, Any]:
    return SCHEMAS[kind]["properties"]["spec"]


def at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    for part in dotted.split("."):
        schema = schema["properties"][part]
    return schema


def test_client_host_rule_is_the_domain_rule() -> None:
    host = at(spec("shard"), "client.host")
    assert [v["rule"] for v in host["x-kubernetes-validations"]] == [cel_host_rule()]
    assert host["maxLength"] == 253


def test_shard_cross_field_rules_are_the_domain_rules() -> None:
    rules = [(v["rule"], v["message"]) for v in spec("shard")["x-kubernetes-validations"]]
    assert rules == list(SHARD_CEL_RULES)


@pytest.mark.parametrize("field", ["admin.sslmode", "client.sslmode"])
def test_sslmode_is_an_enum_defaulting_to_require(field: str) -> None:
    node = at(spec("shard"), field)
    assert node["enum"] == list(SSLMODES) and node["default"] == "require"


@pytest.mark.parametrize(
    ("kind", "field", "default"),
    [
        ("shard", "engine", "postgres"),
        ("shard", "accepting", True),
        ("shard", "admin.port", 5432),
        ("shard", "admin.secretRef.userKey", "user"),
        ("shard", "admin.secretRef.passwordKey", "password"),
        ("shard", "client.port", 5432),
        ("consumer", "tokenSecretRef.key", "sha256"),
        ("consumer", "disabled", False),
        ("database", "engine", "postgres"),
        ("database", "sizeClass", ""),
        ("shard", "drain", False),
        ("databasemove", "mode", "Auto"),
        ("databasemove", "force", False),
        ("databasemove", "abort", False),
    ],
)
def test_defaults_of_the_seed(kind: str, field: str, default: Any) -> None:
    assert at(spec(kind), field)["default"] == default


def test_max_databases_limits() -> None:
    assert at(spec("shard"), "maxDatabases")["minimum"] == 1
    assert "maxDatabases" in spec("shard")["required"]
    consumer_max = at(spec("consumer"), "maxDatabases")
    assert consumer_max["minimum"] == 0 and "default" not in consumer_max
    assert "maxDatabases" not in spec("consumer").get("required", [])


@pytest.mark.parametrize("field", ["consumer", "externalId", "engine"])
def test_database_identity_is_immutable(field: str) -> None:
    rules = [v["rule"] for v in at(spec("database"), field)["x-kubernetes-validations"]]
    assert rules == ["self == oldSelf"]
    assert "x-kubernetes-validations" not in at(spec("database"), "sizeClass")


@pytest.mark.parametrize(
    ("kind", "model"),
    [
        ("shard", ShardStatus),
        ("consumer", ConsumerStatus),
        ("database", DatabaseStatus),
        ("databasemove", DatabaseMoveStatus),
        (CLAIM_KEY, DatabaseClaimStatus),
    ],
)
def test_status_schema_has_exactly_the_domain_status_fields(kind: str, model: type[BaseModel]) -> None:
    status = SCHEMAS[kind]["properties"]["status"]
    assert set(status["properties"]) == {f.alias for f in model.model_fields.values()}
    assert not any("default" in node for _, node in nodes(status))
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


@pytest.mark.parametrize("field", ["sizeClass", "databaseId", "secretName"])
def test_claim_identity_is_immutable(field: str) -> None:
    rules = [v["rule"] for v in at(spec(CLAIM_KEY), field)["x-kubernetes-validations"]]
    assert rules == ["self == oldSelf"]
    assert [(v["rule"], v["message"]) for v in spec(CLAIM_KEY)["x-kubernetes-validations"]] == list(CLAIM_CEL_RULES)
    assert at(spec(CLAIM_KEY), "deletionPolicy")["enum"] == ["Delete", "Orphan"]
    assert at(spec(CLAIM_KEY), "deletionPolicy")["default"] == "Delete"


def test_a_field_without_description_fails_generation() -> None:
    class Undocumented(BaseModel):
        """A model."""

        documented: int = Field(description="yes")
        bare: int

    with pytest.raises(SchemaError, match="bare: no description"):
        structural_schema(Undocumented)


def test_a_real_union_cannot_be_structural() -> None:
    class Union(BaseModel):
        """A model."""

        value: int | str = Field(description="either")

    with pytest.raises(SchemaError, match="unions"):
        structural_schema(Union)


@pytest.mark.parametrize("field", ["database", "target"])
def test_a_moves_database_and_target_are_immutable(field: str) -> None:
    rules = [v["rule"] for v in at(spec("databasemove"), field)["x-kubernetes-validations"]]
    assert rules == ["self == oldSelf"]
    assert spec("databasemove")["required"] == ["database", "target"]
    assert "x-kubernetes-validations" not in at(spec("databasemove"), "abort")


def test_a_moves_mode_and_phase_are_enums() -> None:
    assert at(spec("databasemove"), "mode")["enum"] == ["Online", "Offline", "Auto"]
    phase = SCHEMAS["databasemove"]["properties"]["status"]["properties"]["phase"]
    assert phase["enum"] == [
        "Pending",
        "Preflight",
        "Copying",
        "CatchingUp",
        "CuttingOver",
        "Completed",
        "RollingBack",
        "Aborted",
        "RolledBack",
        "Failed",
    ]
