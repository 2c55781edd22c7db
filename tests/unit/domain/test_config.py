"""The install config: defaults, every invalid key named, retention, size classes."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from domain import config as dc
from domain.version import __version__

MINIMAL: dict[str, Any] = {"tls": {"secretName": "dbprovider-tls"}}


def load(**overrides: Any) -> dc.InstallConfig:
    return dc.load_install_config({**MINIMAL, **overrides})


def problems(data: Any) -> dict[str, str]:
    with pytest.raises(dc.ConfigError) as excinfo:
        dc.load_install_config(data)
    return dict(excinfo.value.problems)


def test_defaults() -> None:
    config = load()
    assert config.release_name == "dbprovider"
    assert config.namespace == "dbprovider"
    assert config.image == f"ghcr.io/bnerd/dbprovider:{__version__}"
    assert config.replicas == 2
    assert config.tls.secret_name == "dbprovider-tls"
    assert config.shard_secrets == ()
    assert config.size_classes == {}
    assert config.connection_limit.default == 10
    assert config.deletion_protection.enabled is True
    assert config.deletion_protection.break_glass_groups == ("system:masters",)
    assert config.metrics.service_monitor.enabled is False
    assert config.prometheus_rule.enabled is False
    assert config.prometheus_rule.cluster == ""
    assert config.prometheus_rule.job_selector == ""
    assert config.soft_delete.retention == timedelta(days=7)
    assert config.soft_delete.allow_undelete is False  # consumers cannot undo a delete unless the install says so
    assert config.engines.cloudberry.enabled is False


def test_full_config_parses() -> None:
    config = dc.load_install_config(
        {
            "releaseName": "db-provider",
            "namespace": "databases",
            "image": "registry.example/dbprovider@sha256:" + "a" * 64,
            "replicas": 3,
            "tls": {"secretName": "api-tls"},
            "shardSecrets": [
                {"namespace": "databases", "name": "pg-shard01-pguser-provisioner"},
                {"namespace": "other", "name": "b"},
                {"namespace": "other", "name": "a"},
                {"namespace": "other", "name": "a"},
            ],
            "sizeClasses": {"small": {"connectionLimit": 5}, "unlimited": {"connectionLimit": -1}},
            "connectionLimit": {"default": 20},
            "deletionProtection": {
                "enabled": False,
                "breakGlassGroups": ["platform-admins", "system:masters"],
            },
            "metrics": {"serviceMonitor": {"enabled": True}},
            "prometheusRule": {"enabled": True, "cluster": "db-cluster-1", "jobSelector": "dbprov"},
            "softDelete": {"retention": "36h"},
            "engines": {"cloudberry": {"enabled": True}},
        }
    )
    assert config.replicas == 3
    assert config.resolve_connection_limit("unlimited") == -1
    assert config.effective_job_selector() == "dbprov"
    assert config.soft_delete.retention == timedelta(hours=36)
    assert config.shard_secrets_by_namespace() == {
        "databases": ("pg-shard01-pguser-provisioner",),
        "other": ("a", "b"),
    }
    # Only listed Secrets are admin credentials, the release namespace ("databases") included.
    assert config.may_read_admin_secret("databases", "pg-shard01-pguser-provisioner")
    assert not config.may_read_admin_secret("databases", "api-tls")
    assert config.may_read_admin_secret("other", "a")
    assert not config.may_read_admin_secret("other", "c")
    assert config.shard_secrets_in_release_namespace() == ("pg-shard01-pguser-provisioner",)
    assert config.engines.cloudberry.enabled is True


def test_effective_job_selector_defaults_to_the_metrics_service() -> None:
    assert load().effective_job_selector() == "dbprovider-metrics"
    assert load(releaseName="db-provider").effective_job_selector() == "db-provider-metrics"
    assert load(releaseName="db-provider").metrics_service_name() == "db-provider-metrics"


def test_config_is_frozen() -> None:
    config = load()
    with pytest.raises(ValueError):
        config.replicas = 5  # type: ignore[misc]


def test_dump_round_trip_uses_camel_case_and_duration_strings() -> None:
    config = load(softDelete={"retention": "36h", "allowUndelete": True}, sizeClasses={"s": {"connectionLimit": 1}})
    dumped = config.model_dump(by_alias=True, mode="json")
    assert dumped["softDelete"] == {"retention": "1d12h", "allowUndelete": True, "rememberDrops": "1h"}
    assert dumped["tls"] == {"secretName": "dbprovider-tls"}
    assert dumped["deletionProtection"]["breakGlassGroups"] == ["system:masters"]
    assert dc.load_install_config(dumped) == config


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"namespace": "Db"}, "namespace"),
        ({"namespace": ""}, "namespace"),
        ({"namespace": "a.b"}, "namespace"),
        ({"releaseName": "1abc"}, "releaseName"),
        ({"releaseName": "a" * 56}, "releaseName"),
        ({"image": ""}, "image"),
        ({"image": "a b"}, "image"),
        ({"image": 5}, "image"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": -1}, "replicas"),
        ({"replicas": "2"}, "replicas"),
        ({"replicas": 1.5}, "replicas"),
        ({"tls": {}}, "tls.secretName"),
        ({"tls": {"secretName": ""}}, "tls.secretName"),
        ({"tls": {"secretName": "Bad_Name"}}, "tls.secretName"),
        ({"tls": None}, "tls"),
        ({"tls": {"secretName": "x", "extra": 1}}, "tls.extra"),
        ({"shardSecrets": [{"namespace": "db"}]}, "shardSecrets[0].name"),
        (
            {"shardSecrets": [{"namespace": "db", "name": "ok"}, {"namespace": "DB", "name": "ok"}]},
            "shardSecrets[1].namespace",
        ),
        ({"shardSecrets": {"namespace": "db", "name": "x"}}, "shardSecrets"),
        ({"sizeClasses": {"small": {"connectionLimit": -2}}}, "sizeClasses.small.connectionLimit"),
        ({"sizeClasses": {"small": {}}}, "sizeClasses.small.connectionLimit"),
        ({"sizeClasses": {"small": {"connectionLimit": "5"}}}, "sizeClasses.small.connectionLimit"),
        ({"sizeClasses": {"small": {"connectionLimit": 5, "cpu": 1}}}, "sizeClasses.small.cpu"),
        ({"sizeClasses": {"-bad": {"connectionLimit": 5}}}, "sizeClasses.-bad (key)"),
        ({"sizeClasses": []}, "sizeClasses"),
        ({"connectionLimit": {"default": -2}}, "connectionLimit.default"),
        ({"connectionLimit": {"default": None}}, "connectionLimit.default"),
        ({"connectionLimit": 10}, "connectionLimit"),
        ({"deletionProtection": {"enabled": "true"}}, "deletionProtection.enabled"),
        ({"deletionProtection": {"breakGlassGroups": [""]}}, "deletionProtection.breakGlassGroups[0]"),
        (
            {"deletionProtection": {"breakGlassGroups": "system:masters"}},
            "deletionProtection.breakGlassGroups",
        ),
        ({"metrics": {"serviceMonitor": {"enabled": "no"}}}, "metrics.serviceMonitor.enabled"),
        ({"metrics": {"servicemonitor": {"enabled": True}}}, "metrics.servicemonitor"),
        ({"prometheusRule": {"enabled": 1}}, "prometheusRule.enabled"),
        ({"softDelete": {"retention": "-1d"}}, "softDelete.retention"),
        ({"softDelete": {"retention": "7"}}, "softDelete.retention"),
        ({"softDelete": {"retention": 7}}, "softDelete.retention"),
        ({"softDelete": {"retention": "1w"}}, "softDelete.retention"),
        ({"softDelete": {"retention": "seven days"}}, "softDelete.retention"),
        ({"softDelete": {"allowUndelete": "yes"}}, "softDelete.allowUndelete"),
        ({"softDelete": {"allowUndelete": 1}}, "softDelete.allowUndelete"),
        ({"moves": {"offlineMaxSize": "0"}}, "moves.offlineMaxSize"),
        ({"moves": {"offlineMaxSize": "1GB"}}, "moves.offlineMaxSize"),
        ({"moves": {"offlineMaxSize": 1024}}, "moves.offlineMaxSize"),
        ({"moves": {"rollbackWindow": "-1d"}}, "moves.rollbackWindow"),
        ({"moves": {"rollbackWindow": "a week"}}, "moves.rollbackWindow"),
        ({"moves": {"stuckAfter": "30s"}}, "moves.stuckAfter"),
        ({"moves": {"stuckAfter": "six hours"}}, "moves.stuckAfter"),
        ({"engines": {"cloudberry": {"enabled": "on"}}}, "engines.cloudberry.enabled"),
        ({"engines": {"mysql": {"enabled": True}}}, "engines.mysql"),
        ({"shardTLS": {"caBundle": {}}}, "shardTLS.caBundle"),
        (
            {"shardTLS": {"caBundle": {"configMap": {"name": "ca", "key": "c"}, "secret": {"name": "ca", "key": "c"}}}},
            "shardTLS.caBundle",
        ),
        ({"shardTLS": {"caBundle": {"configMap": {"name": "ca"}}}}, "shardTLS.caBundle.configMap.key"),
        (
            {"shardTLS": {"caBundle": {"configMap": {"name": "Not_A_Name", "key": "ca.crt"}}}},
            "shardTLS.caBundle.configMap.name",
        ),
        ({"shardTls": {}}, "shardTls"),
        ({"unknownKey": 1}, "unknownKey"),
        ({"tls_secretName": "x"}, "tls_secretName"),
    ],
)
def test_invalid_keys_are_named(overrides: dict[str, Any], path: str) -> None:
    found = problems({**MINIMAL, **overrides})
    assert path in found, found
    with pytest.raises(dc.ConfigError, match=re.escape(f"{path}: ")):
        dc.load_install_config({**MINIMAL, **overrides})


def test_tls_secret_name_is_required() -> None:
    assert problems({}) == {"tls": "is required"}
    assert problems(None) == {"tls": "is required"}


def test_every_offending_key_is_named_in_one_error() -> None:
    with pytest.raises(dc.ConfigError) as excinfo:
        dc.load_install_config(
            {
                "tls": {"secretName": ""},
                "replicas": 0,
                "prometheusRule": {"cluster": 'a"b', "jobSelector": "a\\b"},
                "softDelete": {"retention": "-5m"},
                "bogus": True,
            }
        )
    message = str(excinfo.value)
    for path in [
        "tls.secretName",
        "replicas",
        "prometheusRule.cluster",
        "prometheusRule.jobSelector",
        "softDelete.retention",
        "bogus",
    ]:
        assert f"{path}: " in message
    assert len(excinfo.value.problems) == 6


@pytest.mark.parametrize("key", ["cluster", "jobSelector"])
@pytest.mark.parametrize("value", ['a"b', "a\\b", "a\nb", "a\r\nb", "\n", '"', "a`b"])
def test_prometheus_rule_text_refuses_quote_backslash_newline(key: str, value: str) -> None:
    """They go into PromQL strings, and the job selector into a Go template's raw string (backticks)."""
    found = problems({**MINIMAL, "prometheusRule": {key: value}})
    assert found == {f"prometheusRule.{key}": "must not contain '\"', '\\', '`' or a newline"}
    with pytest.raises(dc.ConfigError) as excinfo:
        dc.load_install_config({**MINIMAL, "prometheusRule": {key: value}})
    assert f"prometheusRule.{key}: must not contain '\"', '\\', '`' or a newline" in str(excinfo.value)


@pytest.mark.parametrize("value", ["", "eu-1", "cluster with spaces", "a'b", "{x}"])
def test_prometheus_rule_text_accepts_other_values(value: str) -> None:
    assert load(prometheusRule={"cluster": value, "jobSelector": value}).prometheus_rule.cluster == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("36h", timedelta(hours=36)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("0d", timedelta(0)),
        (0, timedelta(0)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("1h30m15s", timedelta(hours=1, minutes=30, seconds=15)),
        ("007d", timedelta(days=7)),
        (timedelta(hours=1), timedelta(hours=1)),
    ],
)
def test_retention_parsing(value: object, expected: timedelta) -> None:
    assert dc.parse_duration(value) == expected
    assert load(softDelete={"retention": value}).soft_delete.retention == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        " 7d",
        "7d ",
        "7D",
        "-7d",
        "-0",
        "7",
        "1.5h",
        "7days",
        "1w",
        "d",
        "7d-1h",
        "+7d",
        "P7D",
        None,
        7,
        -1,
        1.0,
        True,
        False,
        [],
        timedelta(seconds=-1),
        "9" * 30 + "d",
        "7d\n",
    ],
)
def test_retention_garbage_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        dc.parse_duration(value)
    assert "softDelete.retention" in problems({**MINIMAL, "softDelete": {"retention": value}})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(days=7), "7d"),
        (timedelta(hours=36), "1d12h"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(seconds=59), "59s"),
    ],
)
def test_format_duration_round_trips(value: timedelta, text: str) -> None:
    assert dc.format_duration(value) == text
    assert dc.parse_duration(text) == value


# --- size classes ----------------------------------------------------------------------------------------

SIZED = {
    **MINIMAL,
    "sizeClasses": {
        "small": {"connectionLimit": 5},
        "xl_2": {"connectionLimit": 200},
        "unlimited": {"connectionLimit": -1},
        "none": {"connectionLimit": 0},
    },
    "connectionLimit": {"default": 15},
}


@pytest.mark.parametrize(
    ("size_class", "limit"),
    [("", 15), (None, 15), ("small", 5), ("xl_2", 200), ("unlimited", -1), ("none", 0)],
)
def test_resolve_connection_limit(size_class: str | None, limit: int) -> None:
    assert dc.load_install_config(SIZED).resolve_connection_limit(size_class) == limit


@pytest.mark.parametrize("size_class", ["medium", "Small", "small ", " small", "SMALL", "a;b", "ü"])
def test_unknown_size_class_is_its_own_error(size_class: str) -> None:
    config = dc.load_install_config(SIZED)
    with pytest.raises(dc.UnknownSizeClass) as excinfo:
        config.resolve_connection_limit(size_class)
    assert excinfo.value.size_class == size_class
    assert not isinstance(excinfo.value, dc.ConfigError | ValueError)
    if size_class in ("a;b", "ü", "small ", " small"):
        assert size_class not in str(excinfo.value)
    else:
        assert repr(size_class) in str(excinfo.value)


def test_default_connection_limit_without_size_classes() -> None:
    assert load().resolve_connection_limit("") == 10
    with pytest.raises(dc.UnknownSizeClass):
        load().resolve_connection_limit("small")


@pytest.mark.parametrize("data", [[], "tls: x", 5, ["tls"]])
def test_non_mapping_config_is_refused(data: Any) -> None:
    with pytest.raises(dc.ConfigError, match="must be a mapping"):
        dc.load_install_config(data)


# --- YAML file -------------------------------------------------------------------------------------------


def test_load_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        "tls:\n  secretName: api-tls\nsoftDelete:\n  retention: 0\nprometheusRule:\n  enabled: true\n  cluster: eu-1\n"
    )
    config = dc.load_install_config_file(path)
    assert config.soft_delete.retention == timedelta(0)
    assert config.prometheus_rule.cluster == "eu-1"
    assert config.effective_job_selector() == "dbprovider-metrics"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "tls: is required"),
        ("tls: [\n", "not valid YAML at line"),
        ("- a\n- b\n", "must be a mapping"),
        (
            'prometheusRule:\n  cluster: "a\\"b"\ntls: {secretName: x}\n',
            "prometheusRule.cluster: must not contain",
        ),
        ("tls: {secretName: x}\nreplicas: two\n", "replicas: "),
    ],
)
def test_load_yaml_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    with pytest.raises(dc.ConfigError, match=re.escape(message)):
        dc.load_install_config_file(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(dc.ConfigError, match="cannot read"):
        dc.load_install_config_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize("source", ["configMap", "secret"])
def test_shard_ca_bundle_from_a_config_map_or_a_secret(source: str) -> None:
    ca_bundle = {source: {"name": "shard-ca", "key": "ca.pem"}}
    config = dc.load_install_config({**MINIMAL, "shardTLS": {"caBundle": ca_bundle}})
    bundle = config.shard_tls.ca_bundle
    assert bundle is not None
    ref = bundle.config_map if source == "configMap" else bundle.secret
    assert ref is not None and (ref.name, ref.key) == ("shard-ca", "ca.pem")
    assert config.model_dump(by_alias=True, mode="json")["shardTLS"]["caBundle"][source] == {
        "name": "shard-ca",
        "key": "ca.pem",
    }
    assert dc.load_install_config(MINIMAL).shard_tls.ca_bundle is None


def test_the_offline_move_limit_is_a_size() -> None:
    assert dc.load_install_config(MINIMAL).moves.offline_max_bytes == 2**30
    assert dc.load_install_config({**MINIMAL, "moves": {"offlineMaxSize": "512Mi"}}).moves.offline_max_bytes == 2**29


def test_a_move_is_stuck_after_six_hours_by_default() -> None:
    assert dc.load_install_config(MINIMAL).moves.stuck_after == timedelta(hours=6)
    assert dc.load_install_config({**MINIMAL, "moves": {"stuckAfter": "90m"}}).moves.stuck_after == timedelta(
        minutes=90
    )


def test_the_rollback_window_is_a_duration_of_seven_days_by_default() -> None:
    assert dc.load_install_config(MINIMAL).moves.rollback_window == timedelta(days=7)
    assert dc.load_install_config({**MINIMAL, "moves": {"rollbackWindow": "36h"}}).moves.rollback_window == timedelta(
        hours=36
    )
