"""The DatabaseClaim CRD on the consumer's real apiserver, and claims the provider or a neighbour refuses.

Every claim here names a size class the provider does not offer: the provider refuses it before any
quota is taken, so these tests never use up the consumer's databases.
"""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from domain.resources import CLAIMS
from tests.agent.conftest import Consumer
from tests.support.common import unique

UNKNOWN = {"sizeClass": "no-such-class"}


def test_the_apiserver_applies_defaults_and_refuses_changes_of_identity(consumer: Consumer) -> None:
    claim = consumer.claim(unique("crd"), {**UNKNOWN, "databaseId": "fixed-id"})
    meta = claim["metadata"]
    assert claim["spec"]["deletionPolicy"] == "Delete"
    for patch, message in (
        ({"spec": {"databaseId": "other-id"}}, "is immutable"),
        ({"spec": {"databaseId": None}}, "set when the claim is created, or never"),
        ({"spec": {"sizeClass": "small"}}, "is immutable"),
        ({"spec": {"deletionPolicy": "Keep"}}, "Unsupported value"),
        ({"spec": {"rolloutDeployments": ["Not_A_Name"]}}, "should match"),
        ({"spec": {"rolloutDeployments": ["web", "web"]}}, "Duplicate value"),
        ({"spec": {"rolloutDeployments": [f"d{n}" for n in range(17)]}}, "must have at most 16 items"),
    ):
        with pytest.raises(ApiException) as refused:
            consumer.admin.patch(CLAIMS, meta["name"], patch, meta["namespace"])
        assert refused.value.status == 422 and message in str(refused.value.body), patch
    unnamed = consumer.claim(meta["namespace"], UNKNOWN)
    with pytest.raises(ApiException) as refused:
        consumer.admin.patch(CLAIMS, unnamed["metadata"]["name"], {"spec": {"databaseId": "late"}}, meta["namespace"])
    assert refused.value.status == 422
    consumer.admin.patch(CLAIMS, meta["name"], {"spec": {"deletionPolicy": "Orphan"}}, meta["namespace"])
    consumer.admin.patch(CLAIMS, meta["name"], {"spec": {"rolloutDeployments": ["web"]}}, meta["namespace"])


def test_an_unknown_size_class_is_told_on_the_claim(consumer: Consumer) -> None:
    claim = consumer.claim(unique("refused"), UNKNOWN)
    ready = consumer.wait_condition(claim, "Ready", "False")
    assert ready["reason"] == "UnknownSizeClass"
    status = (consumer.get_claim(claim) or {})["status"]
    assert status["phase"] == "Pending"
    assert consumer.condition(claim, "ProviderReachable")["status"] == "True"
    meta = claim["metadata"]
    assert consumer.secret(meta["namespace"], meta["name"]) is None
    consumer.admin.delete(CLAIMS, meta["name"], meta["namespace"])  # never created: goes at once


def test_two_claims_naming_one_database_id_the_older_keeps_it(consumer: Consumer) -> None:
    database_id = unique("shared")
    first = consumer.claim(unique("ns-a"), {**UNKNOWN, "databaseId": database_id})
    consumer.wait_condition(first, "Ready", "False")
    second = consumer.claim(unique("ns-b"), {**UNKNOWN, "databaseId": database_id})
    conflict = consumer.wait_condition(second, "Ready", "False")
    assert conflict["reason"] == "DatabaseIdConflict"
    assert database_id in conflict["message"] and first["metadata"]["namespace"] not in conflict["message"]
    assert consumer.condition(first, "Ready")["reason"] == "UnknownSizeClass"
