"""Pydantic building blocks shared by the object specs and the install config.

The annotated types carry their JSON schema (pattern, maxLength, CEL rules), so a CRD generated from the
models enforces in the apiserver what the Python validators enforce here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from cryptography import x509
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError, WithJsonSchema
from pydantic.alias_generators import to_camel

from domain.hosts import CEL_HOST_MESSAGE, HOST_MAX_LENGTH, cel_host_rule, validate_client_host
from domain.naming import (
    DNS1035_LABEL_RE,
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_RE,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_RE,
    EXTERNAL_ID_RE,
    PG_IDENTIFIER_MAX_BYTES,
    PG_IDENTIFIER_RE,
    SECRET_KEY_MAX_LENGTH,
    SECRET_KEY_RE,
    validate_dns1035_label,
    validate_dns1123_label,
    validate_dns1123_subdomain,
    validate_external_id,
    validate_secret_key,
)

# What both kinds of model share: immutable, camelCase on the wire, inputs never echoed in errors.
_MODEL_CONFIG = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, hide_input_in_errors=True)


class SpecModel(BaseModel):
    """Base of the Kubernetes object specs: frozen, camelCase, unknown fields ignored.

    Unknown fields are ignored (the apiserver prunes them anyway) so an older reader survives a newer CRD.
    Inputs are hidden from error texts because specs may carry hostile strings.
    """

    model_config = _MODEL_CONFIG | ConfigDict(extra="ignore")


class ConfigModel(BaseModel):
    """Base of the install config: frozen, camelCase, unknown keys refused (a typo must fail the render)."""

    model_config = _MODEL_CONFIG | ConfigDict(extra="forbid")


def _string_schema(max_length: int, pattern: str) -> WithJsonSchema:
    """The CRD schema of a non-empty string field checked by a pattern (what its validator checks)."""
    return WithJsonSchema({"type": "string", "minLength": 1, "maxLength": max_length, "pattern": pattern})


Namespace = Annotated[
    str, AfterValidator(validate_dns1123_label), _string_schema(DNS1123_LABEL_MAX_LENGTH, DNS1123_LABEL_RE)
]
"""A namespace (DNS-1123 label)."""

ObjectName = Annotated[
    str,
    AfterValidator(validate_dns1123_subdomain),
    _string_schema(DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_RE),
]
"""A Kubernetes object name (DNS-1123 subdomain)."""


def object_name_schema(description: str) -> WithJsonSchema:
    """ObjectName's CRD schema with a description (what an array's items need for `kubectl explain`)."""
    schema = _string_schema(DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_RE).json_schema or {}
    return WithJsonSchema({**schema, "description": description})


ServiceName = Annotated[
    str, AfterValidator(validate_dns1035_label), _string_schema(DNS1123_LABEL_MAX_LENGTH, DNS1035_LABEL_RE)
]
"""A Service name (DNS-1035 label)."""

SecretKey = Annotated[str, AfterValidator(validate_secret_key), _string_schema(SECRET_KEY_MAX_LENGTH, SECRET_KEY_RE)]
"""A key in a Secret's data."""

ExternalId = Annotated[
    str, AfterValidator(validate_external_id), _string_schema(DNS1123_LABEL_MAX_LENGTH, EXTERNAL_ID_RE)
]
"""A consumer's id for a database (a DNS label, see domain.naming)."""


def validate_pg_identifier(value: str) -> str:
    """A plain PostgreSQL name (lowercase letters, digits, underscores; at most 63 bytes)."""
    if not re.fullmatch(PG_IDENTIFIER_RE, value) or len(value.encode()) > PG_IDENTIFIER_MAX_BYTES:
        raise ValueError("must be a lowercase PostgreSQL identifier of at most 63 characters")
    return value


PgIdentifier = Annotated[
    str, AfterValidator(validate_pg_identifier), _string_schema(PG_IDENTIFIER_MAX_BYTES, PG_IDENTIFIER_RE)
]
"""A role or database name on a shard (a plain lowercase identifier, used unquoted by operators)."""

Port = Annotated[StrictInt, Field(ge=1, le=65535)]
"""A TCP port."""

Count = Annotated[StrictInt, Field(ge=0)]
"""A number of things (databases, connections, spec changes): zero or more."""

ClientHost = Annotated[
    str,
    AfterValidator(validate_client_host),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 1,
            "maxLength": HOST_MAX_LENGTH,
            "x-kubernetes-validations": [{"rule": cel_host_rule(), "message": CEL_HOST_MESSAGE}],
        }
    ),
]
"""A host handed to consumers (see domain.hosts)."""

_PLAIN_KEY_RE = "[A-Za-z0-9_-]+"


# -- CA certificates handed to consumers -----------------------------------------------------------

CA_CERT_MAX_LENGTH = 65536
# One or more PEM certificate blocks and whitespace, nothing else (no private key, no other PEM type).
CA_CERT_PATTERN = r"^\s*(-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----\s*)+$"
CA_CERT_MESSAGE = "must be PEM CA certificates only: -----BEGIN CERTIFICATE----- blocks, no private key"


def validate_ca_cert(value: str) -> str:
    """PEM certificates that parse (a CA is public: a private key or anything else is refused)."""
    if re.fullmatch(CA_CERT_PATTERN, value) is None:
        raise ValueError(CA_CERT_MESSAGE)
    try:
        x509.load_pem_x509_certificates(value.encode("ascii"))
    except ValueError:
        raise ValueError("holds a CERTIFICATE block that is not a valid X.509 certificate") from None
    return value


CaCertPem = Annotated[
    str,
    AfterValidator(validate_ca_cert),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": CA_CERT_MAX_LENGTH,
            "x-kubernetes-validations": [{"rule": f"self.matches(r'{CA_CERT_PATTERN}')", "message": CA_CERT_MESSAGE}],
        }
    ),
]


def _format_loc(loc: tuple[int | str, ...]) -> str:
    """`('shardSecrets', 0, 'name')` -> `shardSecrets[0].name`; odd keys are quoted, not pasted raw."""
    path = ""
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
        elif item == "[key]":
            path += " (key)"
        elif re.fullmatch(_PLAIN_KEY_RE, item):
            path += f".{item}" if path else item
        else:
            path += f"[{item!r}]"
    return path


def _message(error: Any) -> str:
    """The human part of one pydantic error, without pydantic's 'Value error, ' prefix."""
    if error["type"] == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    if error["type"] == "missing":
        return "is required"
    if error["type"] == "extra_forbidden":
        return "is not a known key"
    return str(error["msg"])


def validation_problems(exc: ValidationError) -> tuple[tuple[str, str], ...]:
    """(dotted camelCase path, message) for every error; inputs are never included."""
    return tuple((_format_loc(tuple(e["loc"])), _message(e)) for e in exc.errors(include_input=False))


def format_validation_error(exc: ValidationError) -> str:
    """One line naming every offending field: `path: message; path: message`."""
    return "; ".join(f"{path}: {msg}" if path else msg for path, msg in validation_problems(exc))
