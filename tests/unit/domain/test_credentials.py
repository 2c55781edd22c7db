"""The credentials Secret contract: one strict decoder, ownership, and what makes the values usable."""

from __future__ import annotations

import base64

import pytest

from domain.constants import API_VERSION, KIND_DATABASE
from domain.credentials import (
    Endpoint,
    SecretState,
    build_secret,
    classify_secret,
    decode_secret_data,
    decode_secret_value,
    encode_secret_value,
    endpoint_patch,
    endpoint_problem,
    is_controlled_by,
    missing_key,
    password_id,
    password_patch,
    password_pending,
    secret_data_bytes,
    secret_data_values,
    secret_digest,
    secret_settled,
)
from domain.specs import ShardSpec

META = {"name": "orders.consumer-a", "namespace": "dbprovider", "uid": "uid-1"}
SPEC = {"consumer": "consumer-a", "externalId": "orders"}
DATABASE = {"apiVersion": API_VERSION, "kind": KIND_DATABASE, "metadata": META, "spec": SPEC}
ENDPOINT = Endpoint("pg.example.com", 5432, "require")


def secret(**changes: str) -> dict:
    built = build_secret(DATABASE, "t_orders_1", "pw", ENDPOINT)
    built["data"].update(changes)
    return built


@pytest.mark.parametrize("raw", ["%%%", "YWJj\n", "YWJ", 7, None])
def test_decoder_is_strict_base64(raw: object) -> None:
    assert decode_secret_value(raw) is None


def test_undecodable_values_read_as_empty_and_count_as_missing() -> None:
    bad_utf8 = base64.b64encode(b"\xff\xfe").decode()
    values = decode_secret_data(secret(user="%%%", host=bad_utf8))
    assert values["user"] == "" and values["host"] == "" and values["password"] == "pw"
    assert missing_key(values) == "host"
    assert secret_data_bytes(secret(), "port") == b"5432" and secret_data_bytes(secret(), "nope") is None
    assert decode_secret_data({"data": None}) == {} and decode_secret_value(encode_secret_value("é")) == "é".encode()


def test_every_decodable_value_of_a_secret_reads_as_bytes() -> None:
    values = secret_data_values(secret(user="%%%"))
    assert "user" not in values and values["port"] == b"5432" and values["password"] == b"pw"
    assert secret_data_values({"data": None}) == {} and secret_data_values({}) == {}


def test_only_a_controller_reference_to_the_uid_makes_it_ours() -> None:
    owned = secret()
    assert is_controlled_by(owned, "uid-1")
    assert not is_controlled_by(owned, "uid-2") and not is_controlled_by(owned, None)
    reference = owned["metadata"]["ownerReferences"][0]
    references = [{**reference, "controller": False}]
    not_controller = {**owned, "metadata": {**owned["metadata"], "ownerReferences": references}}
    assert not is_controlled_by(not_controller, "uid-1")
    assert classify_secret(not_controller, "uid-1", "t_orders_1") is SecretState.FOREIGN
    assert classify_secret(owned, "uid-1", "t_orders_1") is SecretState.OURS


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"host": encode_secret_value("not a host")}, "the host in the credentials Secret is not a valid client host"),
        ({"port": encode_secret_value("70000")}, "the port in the credentials Secret is invalid"),
        ({"port": encode_secret_value("٥٤")}, "the port in the credentials Secret is invalid"),
        ({"sslmode": encode_secret_value("maybe")}, "the sslmode in the credentials Secret is invalid"),
    ],
)
def test_endpoint_problem(changes: dict[str, str], problem: str | None) -> None:
    assert endpoint_problem(decode_secret_data(secret(**changes))) == problem


def test_a_new_password_is_pending_until_its_id_is_applied() -> None:
    built = secret()
    current = password_id(built)
    assert current is not None
    assert password_pending(built, None) and password_pending(built, "other")
    assert not password_pending(built, current)
    rotated = {**built, "metadata": {**built["metadata"], **password_patch("new")["metadata"]}}
    assert password_pending(rotated, current)
    unmarked = {**built, "metadata": {k: v for k, v in built["metadata"].items() if k != "annotations"}}
    assert not password_pending(unmarked, None)


def test_endpoint_of_a_shard_carries_the_spec_defaults() -> None:
    spec = ShardSpec.model_validate(
        {
            "maxDatabases": 1,
            "perconaCluster": {"namespace": "pg", "name": "a"},
            "admin": {"serviceName": "a-primary", "secretRef": {"namespace": "dbprovider", "name": "a"}},
            "client": {"host": "a.example.com"},
        }
    )
    assert Endpoint.of_shard(spec) == Endpoint("a.example.com", 5432, "require")


CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_shard_ca_is_written_kept_current_and_removed_with_the_endpoint() -> None:
    with_ca = Endpoint("pg.example.com", 5432, "verify-full", CA)
    built = build_secret(DATABASE, "t_orders_1", "pw", with_ca)
    assert decode_secret_data(built)["caCert"] == CA
    assert secret_settled(built, "uid-1", "t_orders_1", with_ca)
    assert endpoint_patch(built, with_ca) is None
    # A renewed CA is patched in; a CA the Shard no longer names is removed (a merge patch's null).
    renewed = Endpoint("pg.example.com", 5432, "verify-full", CA + CA)
    assert not secret_settled(built, "uid-1", "t_orders_1", renewed)
    assert endpoint_patch(built, renewed) == {"data": {"caCert": encode_secret_value(CA + CA)}}
    without = Endpoint("pg.example.com", 5432, "require")
    assert not secret_settled(built, "uid-1", "t_orders_1", without)
    assert endpoint_patch(built, without) == {"data": {"sslmode": encode_secret_value("require"), "caCert": None}}


def test_a_secret_without_a_ca_keeps_its_digest_and_version() -> None:
    # Secrets written before the CA existed stay settled: no rewrite, no new credentialsVersion at an upgrade.
    plain = secret()
    assert "caCert" not in plain["data"]
    assert secret_digest(plain) == "55e1def00c74d9f2"  # as computed before the CA existed
    assert secret_settled(plain, "uid-1", "t_orders_1", ENDPOINT)
