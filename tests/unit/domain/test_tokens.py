"""Token hash Secret parsing, hashing and constant-time comparison."""

from __future__ import annotations

import hashlib

import pytest

from domain.tokens import TokenHashes, constant_time_equal, hash_token, parse_token_hashes

H1 = hashlib.sha256(b"token-one").hexdigest()
H2 = hashlib.sha256(b"token-two").hexdigest()
H3 = hashlib.sha256(b"token-three").hexdigest()


@pytest.mark.parametrize(
    ("value", "hashes", "ignored"),
    [
        ("", set(), 0),
        (b"", set(), 0),
        (H1, {H1}, 0),
        (H1.encode(), {H1}, 0),
        (f"{H1}\n", {H1}, 0),
        (f"{H1}\n{H2}\n{H3}", {H1, H2, H3}, 0),
        (f"{H1}\n\n\n{H2}\n", {H1, H2}, 0),
        (f"\n\n{H1}\n\n", {H1}, 0),
        (f"   {H1}   \n\t{H2}\t", {H1, H2}, 0),
        (f"{H1}\r\n{H2}\r\n", {H1, H2}, 0),
        (f"{H1}\r\n\r\n{H2}", {H1, H2}, 0),
        (f"{H1.upper()}", {H1}, 0),
        (f"{H1.upper()}\n{H1}", {H1}, 0),
        (f"{H1[:32].upper()}{H1[32:]}", {H1}, 0),
        (f"{H1}\n{H1}\n{H1}", {H1}, 0),
        (H1[:63], set(), 1),
        (H1 + "a", set(), 1),
        (f"{H1[:63]}\n{H1}a\n{H2}", {H2}, 2),
        ("g" * 64, set(), 1),
        ("z" + H1[1:], set(), 1),
        (f"0x{H1[:62]}", set(), 1),
        (f"{H1[:32]} {H1[32:]}", set(), 1),
        (f"sha256:{H1}", set(), 1),
        ("not a hash\nanother\n" + H2, {H2}, 2),
        ("my-clear-text-token", set(), 1),
        ("   \n\t\n  ", set(), 0),
        (f"\ufeff{H1}", {H1}, 0),
        (f"{H1}\u00a0", {H1}, 0),
        (H1.replace("a", "\uff41"), set(), 1),
        (b"\xff\xfe" + b"\n" + H1.encode(), {H1}, 1),
        (H1[:10].encode() + b"\xc3\x28" + H1[12:].encode() + b"\n" + H2.encode(), {H2}, 1),
        (b"\xe2\x82\n\n" + H1.encode() + b"\r\n", {H1}, 1),
        (bytearray(H1.encode()), {H1}, 0),
    ],
)
def test_parse_token_hashes(value: bytes | str, hashes: set[str], ignored: int) -> None:
    parsed = parse_token_hashes(value)
    assert parsed == TokenHashes(hashes=frozenset(hashes), ignored_lines=ignored)
    assert all(h == h.lower() and len(h) == 64 for h in parsed.hashes)


def test_result_is_frozen() -> None:
    parsed = parse_token_hashes(H1)
    with pytest.raises(AttributeError):
        parsed.ignored_lines = 3  # type: ignore[misc]
    assert isinstance(parsed.hashes, frozenset)


def test_hash_token_is_sha256_hex_of_the_exact_token() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hash_token("abc") != hash_token("abc\n"), "a trailing newline is part of the token"
    assert hash_token("") == hashlib.sha256(b"").hexdigest()
    assert hash_token("ü") == hashlib.sha256("ü".encode()).hexdigest()


def test_shell_recipe_round_trip() -> None:
    token = "5f" * 32  # what `openssl rand -hex 32` prints
    secret_value = hash_token(token) + "\n"
    assert parse_token_hashes(secret_value).matches(hash_token(token))


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("", "", True),
        (H1, H1, True),
        (H1, H2, False),
        (H1, H1[:63], False),
        (H1, H1.upper(), False),
        ("ü", "ü", True),
        ("ü", "u", False),
    ],
)
def test_constant_time_equal(a: str, b: str, equal: bool) -> None:
    assert constant_time_equal(a, b) is equal


@pytest.mark.parametrize(
    ("candidate", "found"),
    [(H1, True), (H2, True), (H1.upper(), True), (H3, False), ("", False), (H1[:63], False)],
)
def test_matches(candidate: str, found: bool) -> None:
    assert parse_token_hashes(f"{H1}\n{H2}").matches(candidate) is found
