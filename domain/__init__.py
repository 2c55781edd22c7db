"""Domain model shared by the API, the reconciler and the manifest generator.

Pure Python (pydantic, PyYAML): no Kubernetes client, no database driver, no I/O except reading a config
file, so `api/` and `reconciler/` can both depend on it without depending on each other.

The names below are the package's surface. Each is imported from its module on first use (PEP 562): a
process that needs only domain.settings or domain.constants, such as the `dbprovider` command line building
its parser, then does not pay for building every pydantic model of domain.config and domain.specs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the type checker sees the real names; at run time __getattr__ imports them
    from domain.config import (
        DEFAULT_IMAGE,
        ConfigError,
        InstallConfig,
        UnknownSizeClass,
        format_duration,
        load_install_config,
        load_install_config_file,
        parse_duration,
    )
    from domain.constants import (
        ANNOTATION_DELETE_REQUESTED_AT,
        ANNOTATION_RESTORE_TENANT,
        ANNOTATION_ROTATE_END_SESSIONS,
        ANNOTATION_ROTATE_REQUESTED_AT,
        API_VERSION,
        DEFAULT_NAMESPACE,
        DEFAULT_RELEASE_NAME,
        FINALIZER_TENANT,
        GROUP,
        LABEL_CONSUMER,
        LABEL_EXTERNAL_ID,
        LABEL_SHARD,
        VERSION,
        ConditionStatus,
        DatabaseConditionType,
        DatabaseReason,
        DriftReason,
        Engine,
        EventReason,
        Phase,
        ShardConditionType,
        ShardReason,
        SslMode,
    )
    from domain.hosts import (
        HOST_MAX_LENGTH,
        HOSTNAME_RE,
        IPV4_RE,
        NUMERIC_NAME_RE,
        InvalidHost,
        cel_host_rule,
        is_valid_client_host,
        validate_client_host,
    )
    from domain.naming import (
        InvalidExternalId,
        InvalidName,
        credentials_secret_name,
        database_object_name,
        is_valid_external_id,
        label_value,
        tenant_name,
        validate_external_id,
    )
    from domain.specs import (
        SSLMODES,
        ConsumerSpec,
        DatabaseSpec,
        ShardSpec,
    )
    from domain.tokens import (
        TokenHashes,
        constant_time_equal,
        hash_token,
        parse_token_hashes,
    )
    from domain.validation import (
        format_validation_error,
        validation_problems,
    )

# Where each exported name lives (tests/unit/domain/test_constants.py checks every name of __all__ resolves).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "domain.config": (
        "DEFAULT_IMAGE",
        "ConfigError",
        "InstallConfig",
        "UnknownSizeClass",
        "format_duration",
        "load_install_config",
        "load_install_config_file",
        "parse_duration",
    ),
    "domain.constants": (
        "ANNOTATION_DELETE_REQUESTED_AT",
        "ANNOTATION_RESTORE_TENANT",
        "ANNOTATION_ROTATE_END_SESSIONS",
        "ANNOTATION_ROTATE_REQUESTED_AT",
        "API_VERSION",
        "DEFAULT_NAMESPACE",
        "DEFAULT_RELEASE_NAME",
        "FINALIZER_TENANT",
        "GROUP",
        "LABEL_CONSUMER",
        "LABEL_EXTERNAL_ID",
        "LABEL_SHARD",
        "VERSION",
        "ConditionStatus",
        "DatabaseConditionType",
        "DatabaseReason",
        "DriftReason",
        "Engine",
        "EventReason",
        "Phase",
        "ShardConditionType",
        "ShardReason",
        "SslMode",
    ),
    "domain.hosts": (
        "HOSTNAME_RE",
        "HOST_MAX_LENGTH",
        "IPV4_RE",
        "NUMERIC_NAME_RE",
        "InvalidHost",
        "cel_host_rule",
        "is_valid_client_host",
        "validate_client_host",
    ),
    "domain.naming": (
        "InvalidExternalId",
        "InvalidName",
        "credentials_secret_name",
        "database_object_name",
        "is_valid_external_id",
        "label_value",
        "tenant_name",
        "validate_external_id",
    ),
    "domain.specs": (
        "SSLMODES",
        "ConsumerSpec",
        "DatabaseSpec",
        "ShardSpec",
    ),
    "domain.tokens": (
        "TokenHashes",
        "constant_time_equal",
        "hash_token",
        "parse_token_hashes",
    ),
    "domain.validation": (
        "format_validation_error",
        "validation_problems",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    """`domain.X` and `from domain import X`: import X's module now and keep X here for the next lookup."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'domain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ANNOTATION_DELETE_REQUESTED_AT",
    "ANNOTATION_RESTORE_TENANT",
    "ANNOTATION_ROTATE_END_SESSIONS",
    "ANNOTATION_ROTATE_REQUESTED_AT",
    "API_VERSION",
    "DEFAULT_IMAGE",
    "DEFAULT_NAMESPACE",
    "DEFAULT_RELEASE_NAME",
    "FINALIZER_TENANT",
    "GROUP",
    "HOSTNAME_RE",
    "HOST_MAX_LENGTH",
    "IPV4_RE",
    "LABEL_CONSUMER",
    "LABEL_EXTERNAL_ID",
    "LABEL_SHARD",
    "NUMERIC_NAME_RE",
    "SSLMODES",
    "VERSION",
    "ConditionStatus",
    "ConfigError",
    "ConsumerSpec",
    "DatabaseConditionType",
    "DatabaseReason",
    "DatabaseSpec",
    "DriftReason",
    "Engine",
    "EventReason",
    "InstallConfig",
    "InvalidExternalId",
    "InvalidHost",
    "InvalidName",
    "Phase",
    "ShardConditionType",
    "ShardReason",
    "ShardSpec",
    "SslMode",
    "TokenHashes",
    "UnknownSizeClass",
    "cel_host_rule",
    "constant_time_equal",
    "credentials_secret_name",
    "database_object_name",
    "format_duration",
    "format_validation_error",
    "hash_token",
    "is_valid_client_host",
    "is_valid_external_id",
    "label_value",
    "load_install_config",
    "load_install_config_file",
    "parse_duration",
    "parse_token_hashes",
    "tenant_name",
    "validate_client_host",
    "validate_external_id",
    "validation_problems",
]
