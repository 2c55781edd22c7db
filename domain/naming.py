"""Names derived from a consumer and an externalId: Kubernetes object names, label values, tenant names.

Every function here is deterministic, so the API and the reconciler compute the same names independently.
The regex constants are RE2-compatible (no escapes, anchored) so they can also go into CRD patterns.
"""

from __future__ import annotations

import hashlib
import re
from typing import TypeGuard

from domain.constants import CREDENTIALS_SECRET_SUFFIX

DNS1123_LABEL_MAX_LENGTH = 63
DNS1123_SUBDOMAIN_MAX_LENGTH = 253
LABEL_VALUE_MAX_LENGTH = 63
PG_IDENTIFIER_MAX_BYTES = 63

# Kubernetes' own definitions (k8s.io/apimachinery/pkg/util/validation): the label for namespaces, the
# subdomain for object names (Kubernetes limits only the total length, not each label).
DNS1123_LABEL_RE = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_RE = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Service names (DNS-1035: must start with a letter).
DNS1035_LABEL_RE = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Keys of Secret / ConfigMap data.
SECRET_KEY_MAX_LENGTH = 253
SECRET_KEY_RE = "^[-._a-zA-Z0-9]+$"
LABEL_VALUE_RE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An unquoted PostgreSQL identifier as we generate them: lowercase ASCII, so no quoting and no case folding.
PG_IDENTIFIER_RE = "^[a-z_][a-z0-9_]*$"
EXTERNAL_ID_RE = DNS1123_LABEL_RE

# Readable Database object names are at most this long, so `<name>-credentials` always fits 253.
DATABASE_NAME_READABLE_MAX = 200
QUOTA_LEDGER_PREFIX = "quota."
_HASH_HEX_LENGTH = 12
_TENANT_ID_PART_MAX = 40
_TENANT_HASH_LENGTH = 10


class InvalidExternalId(ValueError):
    """An externalId that is not a DNS label (the API answers 400 invalid_external_id)."""


class InvalidName(ValueError):
    """A Kubernetes name or namespace that the apiserver would refuse."""


def _sha256_hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _matches(value: object, pattern: str, max_length: int) -> TypeGuard[str]:
    """`value` is a string of at most `max_length` characters matching `pattern`."""
    return isinstance(value, str) and len(value) <= max_length and re.fullmatch(pattern, value) is not None


def _named(valid: bool, value: object, message: str) -> str:
    """`value` if `valid`, else InvalidName(message): the message never echoes the value."""
    if not valid:
        raise InvalidName(message)
    assert isinstance(value, str)
    return value


def is_dns1123_label(value: object) -> TypeGuard[str]:
    """True for a valid namespace / DNS label (1-63 lowercase alphanumerics and hyphens)."""
    return _matches(value, DNS1123_LABEL_RE, DNS1123_LABEL_MAX_LENGTH)


def is_dns1123_subdomain(value: object) -> TypeGuard[str]:
    """True for a valid Kubernetes object name (lowercase DNS subdomain of at most 253 characters)."""
    return _matches(value, DNS1123_SUBDOMAIN_RE, DNS1123_SUBDOMAIN_MAX_LENGTH)


def is_dns1035_label(value: object) -> TypeGuard[str]:
    """True for a valid Service name (a DNS label starting with a letter)."""
    return _matches(value, DNS1035_LABEL_RE, DNS1123_LABEL_MAX_LENGTH)


# What each name rule says when a value breaks it (never the value itself).
_DNS1123_LABEL_RULE = (
    f"must be a DNS label: at most {DNS1123_LABEL_MAX_LENGTH} characters, lowercase letters, digits and '-', "
    "starting and ending with a letter or digit"
)
_DNS1123_SUBDOMAIN_RULE = (
    f"must be a DNS-1123 subdomain: at most {DNS1123_SUBDOMAIN_MAX_LENGTH} characters, lowercase letters, "
    "digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
)
_DNS1035_LABEL_RULE = (
    f"must be a DNS-1035 label: at most {DNS1123_LABEL_MAX_LENGTH} characters, lowercase letters, digits and "
    "'-', starting with a letter and ending with a letter or digit"
)
_SECRET_KEY_RULE = (
    f"must be a Secret key: at most {SECRET_KEY_MAX_LENGTH} characters, letters, digits, '-', '_' and '.'"
)


def validate_dns1123_label(value: object) -> str:
    """Return a valid DNS label (e.g. a namespace) or raise InvalidName."""
    return _named(is_dns1123_label(value), value, _DNS1123_LABEL_RULE)


def validate_dns1123_subdomain(value: object) -> str:
    """Return a valid Kubernetes object name or raise InvalidName."""
    return _named(is_dns1123_subdomain(value), value, _DNS1123_SUBDOMAIN_RULE)


def validate_dns1035_label(value: object) -> str:
    """Return a valid Service name or raise InvalidName."""
    return _named(is_dns1035_label(value), value, _DNS1035_LABEL_RULE)


def validate_secret_key(value: object) -> str:
    """Return a valid Secret data key or raise InvalidName."""
    valid = _matches(value, SECRET_KEY_RE, SECRET_KEY_MAX_LENGTH) and value not in (".", "..")
    return _named(valid, value, _SECRET_KEY_RULE)


def is_valid_external_id(value: object) -> TypeGuard[str]:
    """True if `value` may be used as an externalId."""
    return is_dns1123_label(value)


def validate_external_id(value: object) -> str:
    """Return `value` if it is a valid externalId, else raise InvalidExternalId (without echoing it)."""
    if is_valid_external_id(value):
        return value
    raise InvalidExternalId(
        "externalId must be a DNS label: 1-63 characters, lowercase letters, digits and '-', "
        "starting and ending with a letter or digit"
    )


def database_object_name(consumer: str, external_id: str) -> str:
    """The name of the Database object of (consumer, externalId); readable, unique, a valid object name.

    Normally `<externalId>.<consumer>`. An externalId is a DNS label and contains no dot, so the first dot
    separates the two parts unambiguously: "c.a-b" (consumer "a-b", externalId "c") and "b-c.a" (consumer
    "a", externalId "b-c") cannot coincide, unlike a join with "-".

    If that is longer than DATABASE_NAME_READABLE_MAX (200) characters, the name is its first 200
    characters (minus a dangling dot) plus `-` and 12 hex digits of sha256("<consumer>/<externalId>"),
    i.e. 212 or 213 characters. Readable names are at most 200 characters long, so a hashed name never
    equals a readable one, and `<name>-credentials` still fits in 253 characters.
    """
    validate_dns1123_subdomain(consumer)
    validate_external_id(external_id)
    readable = f"{external_id}.{consumer}"
    if len(readable) <= DATABASE_NAME_READABLE_MAX:
        return readable
    prefix = readable[:DATABASE_NAME_READABLE_MAX].removesuffix(".")
    return f"{prefix}-{_sha256_hex(f'{consumer}/{external_id}', _HASH_HEX_LENGTH)}"


_CLAIM_ID_HASH_LENGTH = 8


def claim_database_id(namespace: str, name: str) -> str:
    """The externalId of a DatabaseClaim that names none: `<namespace>-<name>` cut to fit, plus `-` and
    8 hex digits of sha256("<namespace>/<name>").

    The hash makes it collision-free within the consumer's cluster ("a-b"/"c" and "a"/"b-c" read alike
    but hash apart); the readable part is cut so the whole is a DNS label of at most 63 characters.
    """
    validate_dns1123_label(namespace)
    validate_dns1123_subdomain(name)
    cut = DNS1123_LABEL_MAX_LENGTH - _CLAIM_ID_HASH_LENGTH - 1
    readable = re.sub("[^a-z0-9-]", "-", f"{namespace}-{name}")[:cut].strip("-")
    return validate_external_id(f"{readable}-{_sha256_hex(f'{namespace}/{name}', _CLAIM_ID_HASH_LENGTH)}")


def quota_ledger_name(consumer: str) -> str:
    """The ConfigMap holding a consumer's quota ledger (domain/quota.py), in the release namespace.

    `quota.<consumer>` up to 240 characters; a longer one is cut to 240 and made unique with `-` and
    12 hex digits of sha256(consumer), as `database_object_name` does.
    """
    validate_dns1123_subdomain(consumer)
    readable = f"{QUOTA_LEDGER_PREFIX}{consumer}"
    cut = DNS1123_SUBDOMAIN_MAX_LENGTH - _HASH_HEX_LENGTH - 1
    if len(readable) <= cut:
        return readable
    prefix = readable[:cut].rstrip(".-")
    return f"{prefix}-{_sha256_hex(consumer, _HASH_HEX_LENGTH)}"


def credentials_secret_name(db_name: str) -> str:
    """The Secret holding a Database's credentials, in the release namespace."""
    return f"{db_name}{CREDENTIALS_SECRET_SUFFIX}"


def is_valid_label_value(value: object) -> TypeGuard[str]:
    """True if `value` is a valid Kubernetes label value (may be empty)."""
    return _matches(value, LABEL_VALUE_RE, LABEL_VALUE_MAX_LENGTH)


def label_value(value: str) -> str:
    """`value` itself if it is a valid label value, else a readable prefix plus a 12-hex hash of it.

    Labels are for selection only: a hashed value can be shared by accident or on purpose, so code that
    selects by label must re-check the object's spec.
    """
    if is_valid_label_value(value):
        return value
    cleaned = re.sub("[^A-Za-z0-9._-]", "-", value)
    prefix = cleaned[: LABEL_VALUE_MAX_LENGTH - _HASH_HEX_LENGTH - 1].strip("._-")
    digest = _sha256_hex(value, _HASH_HEX_LENGTH)
    return f"{prefix}-{digest}" if prefix else digest


def tenant_name(external_id: str, uid: str) -> str:
    """The role and database name on the shard for one Database object.

    `t_<externalId, '-' as '_', at most 40 characters>_<10 hex of sha256(uid)>`: lowercase, a valid
    unquoted PostgreSQL identifier of at most 53 bytes, never a keyword and never `pg_`-prefixed. It is
    derived from the object's UID, so a new object with a reused externalId never adopts an old tenant.
    Chosen once and stored in status; never recomputed for an existing tenant.
    """
    validate_external_id(external_id)
    if not isinstance(uid, str) or not uid:
        raise ValueError("uid must be a non-empty string")
    readable = external_id.replace("-", "_")[:_TENANT_ID_PART_MAX]
    return f"t_{readable}_{_sha256_hex(uid, _TENANT_HASH_LENGTH)}"


ALTERNATE_SUFFIX = "_alt"


def alternate_name(tenant: str) -> str:
    """The tenant's second login role, which takes turns with it at rotations with an overlap.

    `<tenant>_alt`: a tenant name ends in `_` and hex digits, so no tenant is ever named like an
    alternate, and distinct tenants have distinct alternates. A tenant name too long for the suffix
    (never one `tenant_name` makes) is cut and keeps a hash of the whole, within 63 bytes.
    """
    if len(tenant.encode()) + len(ALTERNATE_SUFFIX) <= PG_IDENTIFIER_MAX_BYTES:
        return tenant + ALTERNATE_SUFFIX
    keep = PG_IDENTIFIER_MAX_BYTES - len(ALTERNATE_SUFFIX) - _TENANT_HASH_LENGTH - 1
    return f"{tenant[:keep]}_{_sha256_hex(tenant, _TENANT_HASH_LENGTH)}{ALTERNATE_SUFFIX}"


def login_roles(tenant: str) -> tuple[str, str]:
    """The two roles a consumer may be handed for the tenant: the tenant role, then its alternate."""
    return tenant, alternate_name(tenant)
