"""The agent's pure rules: default databaseIds, the binding Secret, whose Secret is whose, backoff, and
which provider answers are worth retrying."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent.binding import binding_data, binding_secret, database_id, differs, is_claims_secret, merged, secret_name
from agent.provider import ProviderError
from agent.runner import backoff
from domain.naming import EXTERNAL_ID_RE, claim_database_id
from domain.objects import ClaimObject

CREDENTIALS = {
    "host": "pg.example",
    "port": 5432,
    "database": "t_app_1",
    "user": "t_app_1",
    "password": "s3cret",
    "sslmode": "require",
    "uri": "postgresql://t_app_1:s3cret@pg.example:5432/t_app_1?sslmode=require",
}


def claim(name: str = "orders", namespace: str = "team-a", uid: str = "uid-1", **spec: Any) -> ClaimObject:
    return ClaimObject.parse(
        {"metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1}, "spec": spec}
    )


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("team-a", "orders"), ("a" * 63, "b" * 253), ("x", "with.dots.in.it"), ("a-b", "c"), ("a", "b-c")],
)
def test_default_database_ids_are_valid_external_ids(namespace: str, name: str) -> None:
    value = claim_database_id(namespace, name)
    assert len(value) <= 63 and re.fullmatch(EXTERNAL_ID_RE, value)


def test_default_database_ids_do_not_collide_where_names_read_alike() -> None:
    assert claim_database_id("a-b", "c") != claim_database_id("a", "b-c")
    assert claim_database_id("team", "x" * 200) != claim_database_id("team", "x" * 199)
    assert claim_database_id("team-a", "orders").startswith("team-a-orders-")


def test_spec_names_win_over_defaults() -> None:
    named = claim(databaseId="fixed", secretName="pg")
    assert (database_id(named), secret_name(named)) == ("fixed", "pg")
    assert secret_name(claim()) == "orders"


def test_the_binding_secret_has_the_service_binding_shape() -> None:
    secret = binding_secret(claim(), binding_data(CREDENTIALS), "v1")
    assert secret["type"] == "servicebinding.io/postgresql"
    assert set(secret["data"]) == {
        "type",
        "provider",
        "host",
        "port",
        "database",
        "username",
        "password",
        "uri",
        "sslmode",
    }
    assert secret["metadata"]["annotations"] == {"db.bnerd.com/credentials-version": "v1"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "ca.crt" not in secret["data"] and "sslrootcert" not in secret["data"]


def test_a_ca_from_the_provider_becomes_the_ca_file_and_sslrootcert_names_it() -> None:
    values = binding_data({**CREDENTIALS, "caCert": "-----BEGIN CERTIFICATE-----\n"})
    assert values["ca.crt"] == "-----BEGIN CERTIFICATE-----\n"
    assert values["sslrootcert"] == "ca.crt"


def test_only_a_difference_is_written() -> None:
    desired = binding_secret(claim(), binding_data(CREDENTIALS), "v1")
    stored = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "7", "labels": {"x": "y"}}}
    stored["metadata"]["labels"] = {**desired["metadata"]["labels"], "team": "a"}
    assert not differs(stored, desired)
    rotated = binding_secret(claim(), binding_data({**CREDENTIALS, "password": "new"}), "v2")
    assert differs(stored, rotated)
    body = merged(stored, rotated)
    assert body["metadata"]["resourceVersion"] == "7" and body["metadata"]["labels"]["team"] == "a"


def test_a_secret_is_the_claims_only_with_its_label_and_no_other_controller() -> None:
    mine = binding_secret(claim(), binding_data(CREDENTIALS), "v1")
    assert is_claims_secret(mine, claim())
    assert not is_claims_secret(mine, claim(uid="uid-2"))  # another claim of that name controls it
    assert not is_claims_secret(mine, claim(name="other"))
    orphaned = {**mine, "metadata": {**mine["metadata"], "ownerReferences": []}}
    assert is_claims_secret(orphaned, claim(uid="uid-2"))  # left by an Orphan claim of the same name
    assert not is_claims_secret({"metadata": {"name": "orders"}}, claim())


def test_backoff_grows_is_capped_and_honours_retry_after() -> None:
    assert 2.5 <= backoff(1, 5.0, 300.0, None) <= 7.5
    assert backoff(20, 5.0, 300.0, None) <= 450.0
    assert backoff(1, 5.0, 300.0, 60.0) >= 60.0


@pytest.mark.parametrize(
    ("status", "code", "transient"),
    [
        (503, "unavailable", True),
        (500, "internal_error", True),
        (429, "too_many_requests", True),
        (429, "quota_exceeded", False),
        (400, "unknown_size_class", False),
        (401, "unauthorized", False),
    ],
)
def test_which_answers_are_retried_as_they_are(status: int, code: str, transient: bool) -> None:
    assert ProviderError(status, code).transient is transient
