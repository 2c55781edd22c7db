"""The shared vocabulary: what the install serves is what the code calls, and the enums spell what the
documented tables (the users' contract) say."""

from __future__ import annotations

import enum

import pytest

import domain
from domain import constants as c
from domain import resources
from domain.config import load_install_config
from infra.render import render_manifests


def test_the_rendered_crds_serve_every_path_the_controllers_and_the_api_call() -> None:
    """A group, version or plural changed on one side only would be a 404 at run time."""
    config = load_install_config({"releaseName": "unit", "namespace": "unit-system", "tls": {"secretName": "t"}})
    crds = [m for m in render_manifests(config) if m["kind"] == "CustomResourceDefinition"]
    served = {
        (crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"])
        for crd in crds
        for version in crd["spec"]["versions"]
        if version["served"]
    }
    called = [resources.SHARDS, resources.CONSUMERS, resources.DATABASES]
    assert {(r.group, r.version, r.plural) for r in called} <= served


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
                "ShardNotReady",
                "LoginFailed",
                "RecoveryOverBudget",
                "LoginTampered",
            ],
        ),
        (
            c.DatabaseConditionType,
            ["Ready", "DeletionHeld", "ConnectionLimitDrift", "TenantDisabled", "TenantDropped", "OwnershipRecorded"],
        ),
        (c.DriftReason, ["ConfigChanged", "UnknownSizeClass"]),
        (c.OwnershipReason, ["Recorded", "Adopted", "ForeignRole", "OwnedByOther", "TenantMissing"]),
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
