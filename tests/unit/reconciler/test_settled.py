"""The resync fast path (reconciler.database.settled): a Ready database is skipped only when its full pass
would find nothing to do; every input the pass acts on sends it to the full pass."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dbprovider.dev_values import DEV_CONFIG
from domain.config import load_install_config
from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_PASSWORD_ID,
    ANNOTATION_ROTATE_REQUESTED_AT,
    API_VERSION,
    FINALIZER_TENANT,
    KIND_DATABASE,
)
from domain.credentials import Endpoint, build_secret, encode_secret_value, password_id
from domain.naming import alternate_name
from reconciler.database.settled import settled

CONFIG = load_install_config(DEV_CONFIG)  # small: connection limit 5
ENDPOINT = Endpoint("pg.example.com", 5432, "verify-full")
TENANT = "t_orders_1a2b3c4d"
NOW = "2026-12-02T01:00:00Z"


def ready_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """A Ready Database as the controller leaves it (small, limit 5, ownership recorded) and its Secret."""
    db: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND_DATABASE,
        "metadata": {
            "name": "orders.team-a",
            "namespace": "dbprovider",
            "uid": "6f1c0d2e-1111-2222-3333-444455556666",
            "resourceVersion": "812",
            "generation": 2,
            "finalizers": [FINALIZER_TENANT],
        },
        "spec": {"consumer": "team-a", "externalId": "orders", "sizeClass": "small", "engine": "postgres"},
    }
    secret = build_secret(db, TENANT, "a-password", ENDPOINT)
    db["status"] = {
        "shard": "shard-a",
        "tenantName": TENANT,
        "phase": "Ready",
        "appliedSizeClass": "small",
        "appliedConnectionLimit": 5,
        "observedGeneration": 2,
        "passwordApplied": password_id(secret),
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Provisioned",
                "message": "tenant exists on the shard",
                "lastTransitionTime": NOW,
                "observedGeneration": 2,
            },
            {
                "type": "OwnershipRecorded",
                "status": "True",
                "reason": "Recorded",
                "message": "recorded",
                "lastTransitionTime": NOW,
                "observedGeneration": 2,
            },
        ],
    }
    return db, secret


def test_a_ready_database_with_nothing_to_do_is_settled() -> None:
    db, secret = ready_pair()
    assert settled(db, ENDPOINT, secret, CONFIG)
    # A Secret written without a password id has nothing pending either.
    del secret["metadata"]["annotations"][ANNOTATION_PASSWORD_ID]
    assert settled(db, ENDPOINT, secret, CONFIG)


def test_a_database_handing_out_its_alternate_with_no_overlap_running_is_settled() -> None:
    db, secret = ready_pair()
    secret["data"]["user"] = encode_secret_value(alternate_name(TENANT))
    db["status"]["loginRole"] = alternate_name(TENANT)
    assert settled(db, ENDPOINT, secret, CONFIG)


def condition(db: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in db["status"]["conditions"] if c["type"] == type_)


def annotate(db: dict[str, Any], key: str, value: str) -> None:
    db["metadata"].setdefault("annotations", {})[key] = value


Change = Callable[[dict[str, Any], dict[str, Any]], object]

# Each leaves something for the full pass to do (or to report): the fast path must not take it.
CHANGES: dict[str, Change] = {
    "Kubernetes delete (held)": lambda db, s: db["metadata"].update(deletionTimestamp=NOW),
    "finalizer missing": lambda db, s: db["metadata"].update(finalizers=[]),
    "delete requested": lambda db, s: annotate(db, ANNOTATION_DELETE_REQUESTED_AT, NOW),
    "rotation requested": lambda db, s: annotate(db, ANNOTATION_ROTATE_REQUESTED_AT, NOW),
    "password pending": lambda db, s: s["metadata"]["annotations"].update({ANNOTATION_PASSWORD_ID: "new"}),
    "resize": lambda db, s: db["spec"].update(sizeClass="large"),
    "class no longer configured": lambda db, s: (
        db["spec"].update(sizeClass="gone"),
        db["status"].update(appliedSizeClass="gone"),
    ),
    "config resolves another limit": lambda db, s: db["status"].update(appliedConnectionLimit=7),
    "new generation": lambda db, s: db["metadata"].update(generation=3),
    "still provisioning": lambda db, s: db["status"].update(phase="Provisioning"),
    "soft-deleted": lambda db, s: db["status"].update(phase="Deleting"),
    "drop scheduled": lambda db, s: db["status"].update(dropAfter=NOW),
    "no tenant name": lambda db, s: db["status"].pop("tenantName"),
    "Ready not true": lambda db, s: condition(db, "Ready").update(status="False", reason="AdminUnavailable"),
    "Ready of an older generation": lambda db, s: condition(db, "Ready").update(observedGeneration=1),
    "Ready with another message": lambda db, s: condition(db, "Ready").update(message="old words"),
    "ownership not recorded": lambda db, s: db["status"]["conditions"].pop(1),
    "deletion held left over": lambda db, s: db["status"]["conditions"].append(
        {"type": "DeletionHeld", "status": "True", "reason": "Held", "message": "", "lastTransitionTime": NOW}
    ),
    "drift left over": lambda db, s: db["status"]["conditions"].append(
        {
            "type": "ConnectionLimitDrift",
            "status": "True",
            "reason": "ConfigChanged",
            "message": "",
            "lastTransitionTime": NOW,
        }
    ),
    "tenant dropped": lambda db, s: db["status"]["conditions"].append(
        {"type": "TenantDropped", "status": "True", "reason": "Dropped", "message": "", "lastTransitionTime": NOW}
    ),
    "Secret of another owner": lambda db, s: s["metadata"]["ownerReferences"][0].update(uid="someone-else"),
    "Secret names another tenant": lambda db, s: s["data"].update(user=encode_secret_value("t_other")),
    "Secret names the alternate, the status not": lambda db, s: s["data"].update(
        user=encode_secret_value(alternate_name(TENANT))
    ),
    "overlap running": lambda db, s: db["status"].update(retireLoginAt=NOW),
    "Secret without a password": lambda db, s: s["data"].update(password=""),
    "Secret password not base64": lambda db, s: s["data"].update(password="%%%"),
    "Secret host not the shard's": lambda db, s: s["data"].update(host=encode_secret_value("old.example.com")),
    "Secret port not the shard's": lambda db, s: s["data"].update(port=encode_secret_value("5433")),
    "Secret sslmode not the shard's": lambda db, s: s["data"].update(sslmode=encode_secret_value("require")),
    "status of another shape": lambda db, s: db.update(status=[]),
    "generation not a number": lambda db, s: db["metadata"].update(generation="2"),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_anything_for_the_pass_to_do_takes_the_full_pass(change: str) -> None:
    db, secret = ready_pair()
    CHANGES[change](db, secret)
    assert not settled(db, ENDPOINT, secret, CONFIG)


def test_a_missing_secret_or_shard_takes_the_full_pass() -> None:
    db, secret = ready_pair()
    assert not settled(db, ENDPOINT, None, CONFIG)  # the pass creates it
    assert not settled(db, None, secret, CONFIG)  # the pass reports the shard missing or invalid
    assert not settled(db, Endpoint("pg.example.com", 5432, "require"), secret, CONFIG)  # the client block changed


def test_the_check_reads_without_changing_the_cached_objects() -> None:
    db, secret = ready_pair()
    before = copy.deepcopy((db, secret))
    settled(db, ENDPOINT, secret, CONFIG)
    assert (db, secret) == before
