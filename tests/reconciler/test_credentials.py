"""The credentials Secret is recognised as ours only when owned and consistent; endpoint patches are minimal."""

from __future__ import annotations

from domain.constants import API_VERSION
from domain.credentials import Endpoint, SecretState, build_secret, classify_secret, endpoint_patch, secret_values
from tests.support.common import b64

DATABASE = {
    "apiVersion": API_VERSION,
    "kind": "Database",
    "metadata": {"name": "orders.consumer-a", "namespace": "dbprovider", "uid": "uid-1"},
    "spec": {"consumer": "consumer-a", "externalId": "orders"},
}
ENDPOINT = Endpoint("pg.example.com", 5432, "require")


def test_built_secret_has_the_six_keys_and_is_owned() -> None:
    secret = build_secret(DATABASE, "t_orders_1", "pw", ENDPOINT)
    assert secret["metadata"]["name"] == "orders.consumer-a-credentials"
    assert secret_values(secret) == {
        "host": "pg.example.com",
        "port": "5432",
        "database": "t_orders_1",
        "user": "t_orders_1",
        "password": "pw",
        "sslmode": "require",
    }
    assert classify_secret(secret, "uid-1", "t_orders_1") is SecretState.OURS


def test_classification() -> None:
    secret = build_secret(DATABASE, "t_orders_1", "pw", ENDPOINT)
    assert classify_secret(None, "uid-1", "t_orders_1") is SecretState.MISSING
    assert classify_secret(secret, "other-uid", "t_orders_1") is SecretState.FOREIGN
    foreign = {**secret, "metadata": {**secret["metadata"], "ownerReferences": []}}
    assert classify_secret(foreign, "uid-1", "t_orders_1") is SecretState.FOREIGN
    assert classify_secret(secret, "uid-1", "t_other") is SecretState.INCONSISTENT
    no_password = {**secret, "data": {**secret["data"], "password": ""}}
    assert classify_secret(no_password, "uid-1", "t_orders_1") is SecretState.INCONSISTENT
    garbage = {**secret, "data": {**secret["data"], "user": "%%%"}}
    assert classify_secret(garbage, "uid-1", "t_orders_1") is SecretState.INCONSISTENT


def test_endpoint_patch_touches_only_changed_endpoint_keys() -> None:
    secret = build_secret(DATABASE, "t_orders_1", "pw", ENDPOINT)
    assert endpoint_patch(secret, ENDPOINT) is None
    patch = endpoint_patch(secret, Endpoint("10.0.0.7", 5432, "verify-full"))
    assert patch == {
        "data": {
            "host": b64("10.0.0.7"),
            "sslmode": b64("verify-full"),
        }
    }
