"""Names: externalId, Database object names, credentials Secret, label values, tenant names."""

from __future__ import annotations

import hashlib
import itertools
import re

import pytest

from domain.naming import (
    DATABASE_NAME_READABLE_MAX,
    DNS1123_SUBDOMAIN_RE,
    LABEL_VALUE_RE,
    PG_IDENTIFIER_RE,
    InvalidExternalId,
    credentials_secret_name,
    database_object_name,
    is_dns1123_subdomain,
    is_valid_external_id,
    is_valid_label_value,
    label_value,
    tenant_name,
    validate_external_id,
)

# PostgreSQL reserved key words that a careless scheme could produce (all lowercase identifiers).
PG_RESERVED = {"all", "user", "table", "select", "order", "group", "default", "public", "current_user"}


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("a", True),
        ("0", True),
        ("tenant-1", True),
        ("1-tenant", True),
        ("a--b", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("", False),
        ("-a", False),
        ("a-", False),
        ("A", False),
        ("Tenant", False),
        ("a.b", False),
        ("a_b", False),
        ("a b", False),
        ("a\n", False),
        ("ü", False),
        ("a/b", False),
        ("..", False),
        (None, False),
        (5, False),
    ],
)
def test_external_id(value: object, ok: bool) -> None:
    assert is_valid_external_id(value) is ok
    if ok:
        assert validate_external_id(value) == value
    else:
        with pytest.raises(InvalidExternalId) as excinfo:
            validate_external_id(value)
        assert isinstance(excinfo.value, ValueError)
        if isinstance(value, str) and value:
            assert repr(value) not in str(excinfo.value)


@pytest.mark.parametrize(
    ("consumer", "external_id", "expected"),
    [
        ("consumer-a", "tenant-1", "tenant-1.consumer-a"),
        ("a", "b", "b.a"),
        ("team.example", "x", "x.team.example"),
    ],
)
def test_readable_database_names(consumer: str, external_id: str, expected: str) -> None:
    assert database_object_name(consumer, external_id) == expected


def test_hyphen_ambiguity_does_not_collide() -> None:
    first = database_object_name("a-b", "c")
    second = database_object_name("a", "b-c")
    assert first != second
    assert (first, second) == ("c.a-b", "b-c.a")


def test_names_are_collision_free_over_a_grid() -> None:
    parts = ["a", "b", "a-b", "b-c", "a-b-c", "c", "a.b", "b.c"]
    ext_ids = ["a", "b", "c", "a-b", "b-c"]
    names = {}
    for consumer, ext in itertools.product(parts, ext_ids):
        name = database_object_name(consumer, ext)
        assert name not in names, (name, names.get(name), (consumer, ext))
        names[name] = (consumer, ext)
        head, _, tail = name.partition(".")
        assert (tail, head) == (consumer, ext), "the first dot splits the name unambiguously"


LONG_CONSUMER = ".".join(["c" * 63, "d" * 63, "e" * 63, "f" * 61])  # 253 characters


@pytest.mark.parametrize(
    ("consumer", "external_id"),
    [
        ("c" * 136, "e" * 63),  # 63 + 1 + 136 = 200: still readable
        ("c" * 137, "e" * 63),  # 201: hashed
        ("c" * 253, "e" * 63),
        (LONG_CONSUMER, "e" * 63),
        (LONG_CONSUMER, "x"),
        ("c" * 199, "x"),  # 201 characters: the shortest hashed case
        ("a" * 197 + ".bbbb", "x"),  # the cut lands on a dot, which is dropped
        ("a" * 197 + "-b" * 20, "x"),  # the cut lands on a hyphen, which may stay
        ("c" * 253, "a"),
    ],
)
def test_long_names_are_valid_and_bounded(consumer: str, external_id: str) -> None:
    name = database_object_name(consumer, external_id)
    readable = f"{external_id}.{consumer}"
    assert is_dns1123_subdomain(name), name
    assert re.fullmatch(DNS1123_SUBDOMAIN_RE, name)
    assert is_dns1123_subdomain(credentials_secret_name(name))
    assert len(credentials_secret_name(name)) <= 253
    if len(readable) <= DATABASE_NAME_READABLE_MAX:
        assert name == readable
    else:
        digest = hashlib.sha256(f"{consumer}/{external_id}".encode()).hexdigest()[:12]
        assert name.endswith("-" + digest)
        assert len(name) in (212, 213) and len(name) > DATABASE_NAME_READABLE_MAX
        assert name.startswith(readable[:150]), "the hashed form keeps a readable prefix"


def test_a_dangling_dot_is_dropped_before_the_hash() -> None:
    name = database_object_name("a" * 197 + ".bbbb", "x")
    assert len(name) == 212 and ".-" not in name
    assert database_object_name("a" * 197 + "-b" * 20, "x").count("--") == 1


def test_hashed_names_differ_when_only_the_tail_differs() -> None:
    base = "c" * 240
    first = database_object_name(base + "1", "x")
    second = database_object_name(base + "2", "x")
    assert first != second
    assert first[:-12] == second[:-12]


def test_readable_boundary() -> None:
    consumer = "c" * (DATABASE_NAME_READABLE_MAX - 2)
    assert database_object_name(consumer, "x") == "x." + consumer
    assert len(database_object_name(consumer + "c", "x")) > DATABASE_NAME_READABLE_MAX


@pytest.mark.parametrize(
    ("consumer", "external_id", "error"),
    [
        ("consumer-a", "Bad", InvalidExternalId),
        ("consumer-a", "a.b", InvalidExternalId),
        ("consumer-a", "", InvalidExternalId),
        ("Consumer", "x", ValueError),
        ("", "x", ValueError),
        ("a" * 254, "x", ValueError),
    ],
)
def test_database_name_refuses_invalid_input(consumer: str, external_id: str, error: type) -> None:
    with pytest.raises(error):
        database_object_name(consumer, external_id)


def test_credentials_secret_name() -> None:
    assert credentials_secret_name("tenant-1.consumer-a") == "tenant-1.consumer-a-credentials"


@pytest.mark.parametrize(
    "value",
    ["", "a", "consumer-a", "A.b_c-D", "a" * 63, "1", "x.y", "tenant-1"],
)
def test_valid_label_values_are_kept(value: str) -> None:
    assert is_valid_label_value(value)
    assert label_value(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "a" * 64,
        "c" * 253,
        LONG_CONSUMER,
        "-a",
        "a-",
        ".a",
        "a b",
        "ü",
        "a/b",
        "___",
        "a;b$(x)",
        "-" * 70,
    ],
)
def test_invalid_label_values_are_hashed(value: str) -> None:
    result = label_value(value)
    assert result != value
    assert len(result) <= 63
    assert re.fullmatch(LABEL_VALUE_RE, result)
    assert result.endswith(hashlib.sha256(value.encode()).hexdigest()[:12])
    assert label_value(value) == result, "deterministic"


def test_label_values_keep_a_readable_prefix() -> None:
    assert label_value("c" * 100).startswith("c" * 40)
    assert label_value("a" * 64) != label_value("a" * 65)


@pytest.mark.parametrize(
    ("external_id", "uid"),
    [
        ("a", "uid"),
        ("tenant-1", "6f1c1f4e-1111-4a57-9f87-8c3c0c0b8a11"),
        ("1abc", "u"),
        ("0", "u"),
        ("all", "u"),
        ("user", "u"),
        ("a" * 63, "6f1c1f4e-1111-4a57-9f87-8c3c0c0b8a11"),
        ("a-" * 31 + "a", "x"),
        ("pg-catalog", "x"),
    ],
)
def test_tenant_names_are_valid_identifiers(external_id: str, uid: str) -> None:
    name = tenant_name(external_id, uid)
    assert re.fullmatch(PG_IDENTIFIER_RE, name)
    assert len(name.encode()) <= 63
    assert name == name.lower()
    assert name.startswith("t_") and not name.startswith("pg_")
    assert name not in PG_RESERVED
    assert name.endswith("_" + hashlib.sha256(uid.encode()).hexdigest()[:10])
    assert external_id.replace("-", "_")[:40] in name


def test_tenant_name_format() -> None:
    digest = hashlib.sha256(b"uid-1").hexdigest()[:10]
    assert tenant_name("tenant-1", "uid-1") == f"t_tenant_1_{digest}"


def test_tenant_name_depends_on_the_uid() -> None:
    assert tenant_name("tenant-1", "uid-1") != tenant_name("tenant-1", "uid-2")
    assert tenant_name("tenant-1", "uid-1") == tenant_name("tenant-1", "uid-1")


@pytest.mark.parametrize(("external_id", "uid"), [("Bad", "u"), ("", "u"), ("ok", ""), ("ok", None)])
def test_tenant_name_refuses_invalid_input(external_id: str, uid: str) -> None:
    with pytest.raises(ValueError):
        tenant_name(external_id, uid)
