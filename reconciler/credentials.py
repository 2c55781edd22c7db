"""Moved to domain.credentials (the API reads the same Secret format); this re-export goes at the merge."""

from __future__ import annotations

from domain.credentials import (
    ENDPOINT_KEYS,
    Endpoint,
    SecretState,
    build_secret,
    classify_secret,
    credentials_labels,
    decode_secret_data,
    endpoint_patch,
    new_password,
    new_password_id,
    password_id,
    password_patch,
    secret_values,
)

__all__ = [
    "ENDPOINT_KEYS",
    "Endpoint",
    "SecretState",
    "build_secret",
    "classify_secret",
    "credentials_labels",
    "decode_secret_data",
    "endpoint_patch",
    "new_password",
    "new_password_id",
    "password_id",
    "password_patch",
    "secret_values",
]
