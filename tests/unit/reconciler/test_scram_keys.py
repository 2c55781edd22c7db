"""SCRAM key derivation and the key cache, without a server (the exchange is in tests/sql)."""

from __future__ import annotations

import base64

import pytest

from reconciler.sql import scram_keys, session
from reconciler.sql.scram_keys import KeyCache, ScramKeys, derivable
from reconciler.sql.session import AdminEndpoint, admin_keys_key
from reconciler.sql.tenant import scram_verifier

# RFC 7677's example: user "user", password "pencil", salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 rounds.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_KEY = "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="


def test_keys_are_rfc_7677s() -> None:
    keys = ScramKeys.derive("pencil", RFC_SALT, 4096)
    assert keys.conninfo()["scram_server_key"] == RFC_SERVER_KEY
    assert keys.verifier() == scram_verifier("pencil", salt=RFC_SALT, iterations=4096)
    assert keys.verifier().startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")


def test_only_printable_ascii_passwords_are_derived() -> None:
    assert derivable("Correct horse battery staple 9!")
    assert not derivable("")
    assert not derivable("pässword")
    assert not derivable("tab\there")


def test_the_cache_forgets_the_oldest_the_unused_and_waits_after_a_failure() -> None:
    cache = KeyCache(capacity=2, retry_after=60, max_idle=600)
    keys = ScramKeys.new("p")
    for name in ("a", "b", "c"):
        cache.put(name, keys, now=0.0)
    assert (cache.get("a", now=1.0), len(cache)) == (None, 2)
    assert not cache.wants("b")
    assert cache.get("b", now=500.0) is keys  # used: kept 600 s more
    assert cache.get("c", now=700.0) is None  # unused for 700 s: gone
    assert cache.get("b", now=1000.0) is keys

    cache.failed("d", now=100.0)
    assert not cache.wants("d", now=130.0)
    assert cache.wants("d", now=160.0)
    cache.drop("b")
    assert cache.wants("b")


def test_an_old_libpq_gets_nothing_new(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = AdminEndpoint("db", 5432, "provisioner", "secret-password")
    monkeypatch.setattr(scram_keys, "SUPPORTED", False)
    assert admin_keys_key(endpoint) is None
    monkeypatch.setattr(scram_keys, "SUPPORTED", True)
    assert admin_keys_key(endpoint) is not None
    assert "secret-password" not in repr(endpoint) and admin_keys_key(endpoint) != "secret-password"
    assert session.ADMIN_KEYS.get(admin_keys_key(endpoint) or "") is None
