"""The shared vocabulary spells exactly what the seed's tables say."""

from __future__ import annotations

import enum

import pytest

import domain
from domain import constants as c


def test_group_and_keys() -> None:
    assert (c.GROUP, c.VERSION, c.API_VERSION) == ("db.bnerd.com", "v1alpha1", "db.bnerd.com/v1alpha1")
    assert (c.PLURAL_SHARDS, c.PLURAL_CONSUMERS, c.PLURAL_DATABASES) == ("shards", "consumers", "databases")
    assert c.LABEL_CONSUMER == "db.bnerd.com/consumer"
    assert c.LABEL_EXTERNAL_ID == "db.bnerd.com/external-id"
    assert c.LABEL_SHARD == "db.bnerd.com/shard"
    assert c.ANNOTATION_DELETE_REQUESTED_AT == "db.bnerd.com/delete-requested-at"
    assert c.FINALIZER_TENANT == "db.bnerd.com/tenant"
    assert c.CREDENTIALS_KEYS == ("host", "port", "database", "user", "password", "sslmode")


@pytest.mark.parametrize(
    ("enum_type", "values"),
    [
        (c.Phase, ["Provisioning", "Ready", "Deleting", "Deleted", "Failed"]),
        (
            c.DatabaseReason,
            [
                "Provisioning",
                "Provisioned",
                "NoCapacity",
                "ShardsUnavailable",
                "InvalidSizeClass",
                "ShardNotFound",
                "AdminUnavailable",
                "EnsureFailed",
                "CredentialsSecretConflict",
                "Deleting",
                "SetLimitFailed",
                "DisableFailed",
                "DropFailed",
                "RestoreRefused",
            ],
        ),
        (
            c.DatabaseConditionType,
            ["Ready", "DeletionHeld", "ConnectionLimitDrift", "TenantDisabled", "TenantDropped"],
        ),
        (c.DriftReason, ["ConfigChanged", "UnknownSizeClass"]),
        (c.Engine, ["postgres", "cloudberry"]),
        (c.SslMode, ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]),
    ],
)
def test_enums_match_the_seed(enum_type: type[enum.StrEnum], values: list[str]) -> None:
    assert [member.value for member in enum_type] == values
    assert all(isinstance(member, str) for member in enum_type)


def test_shard_reasons_include_the_seed_table() -> None:
    required = {"Ok", "AdminAuthFailed", "AdminSecretInvalid", "Unreachable", "ClusterNotRunning"}
    assert required <= {r.value for r in c.ShardReason}
    assert {"Ready", "AdminAuthFailed", "Unreachable"} <= {t.value for t in c.ShardConditionType}


def test_str_enums_compare_and_format_as_plain_strings() -> None:
    assert c.Phase.READY == "Ready"
    assert f"{c.DatabaseReason.NO_CAPACITY}" == "NoCapacity"


def test_package_exports_resolve() -> None:
    for name in domain.__all__:
        assert getattr(domain, name) is not None
