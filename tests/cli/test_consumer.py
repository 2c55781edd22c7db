"""`dbprovider consumer new` and `consumer rotate` on real files: what lands in the YAML, where the token
goes (and where it never goes), and that bad input exits 2 with the files left as they were."""

from __future__ import annotations

import base64
import hashlib
import re
import stat
from pathlib import Path

import pytest

from domain.constants import API_VERSION
from tests.cli.conftest import read_docs, run, run_on_terminal, write_yaml
from tests.support.common import b64

TOKEN_RE = re.compile(r"^[0-9a-f]{64}$", re.MULTILINE)


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hash_lines(secret_file: Path) -> list[str]:
    (secret,) = read_docs(secret_file)
    if "stringData" in secret:
        return secret["stringData"]["sha256"].split()
    return base64.b64decode(secret["data"]["sha256"]).decode().split()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# -- consumer new -----------------------------------------------------------------------------------------


def test_new_on_a_terminal_prints_the_token_once_and_commits_only_its_hash(tmp_path: Path) -> None:
    command = "consumer new team-a --max-databases 50 --namespace databases --out consumers"
    result = run_on_terminal(*command.split(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tokens = TOKEN_RE.findall(result.stdout)
    assert len(tokens) == 1, result.stdout
    token = tokens[0]
    assert token not in result.stderr

    consumer_file = tmp_path / "consumers" / "team-a.consumer.yaml"
    secret_file = tmp_path / "consumers" / "team-a.token-secret.yaml"
    assert sorted(p.name for p in (tmp_path / "consumers").iterdir()) == [consumer_file.name, secret_file.name]
    (consumer,) = read_docs(consumer_file)
    assert consumer == {
        "apiVersion": API_VERSION,
        "kind": "Consumer",
        "metadata": {"name": "team-a"},
        "spec": {
            "tokenSecretRef": {"namespace": "databases", "name": "team-a-token", "key": "sha256"},
            "maxDatabases": 50,
        },
    }
    (secret,) = read_docs(secret_file)
    assert secret["metadata"] == {"name": "team-a-token", "namespace": "databases"}
    assert hash_lines(secret_file) == [sha256(token)]
    for path in (consumer_file, secret_file):
        assert token not in path.read_text()


def test_two_runs_make_different_256_bit_tokens(tmp_path: Path) -> None:
    first = run("consumer", "new", "a", "--max-databases", "1", "--token-file", "-", cwd=tmp_path)
    second = run("consumer", "new", "b", "--max-databases", "1", "--token-file", "-", cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    assert TOKEN_RE.fullmatch(first.stdout.strip()) and TOKEN_RE.fullmatch(second.stdout.strip())
    assert first.stdout != second.stdout


def test_redirected_stdout_without_a_choice_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    result = run("consumer", "new", "team-a", "--max-databases", "5", "--out", "consumers", cwd=tmp_path)
    assert result.returncode == 2
    assert "--token-file" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "consumers").exists()


def test_token_file_is_private_and_the_token_is_printed_nowhere(tmp_path: Path) -> None:
    result = run("consumer", "new", "team-a", "--max-databases", "5", "--token-file", "team-a.token", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    token_file = tmp_path / "team-a.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert TOKEN_RE.fullmatch(token)
    assert token not in result.stdout + result.stderr
    assert hash_lines(tmp_path / "team-a.token-secret.yaml") == [sha256(token)]


def test_token_to_stdout_on_request_carries_the_token_alone(tmp_path: Path) -> None:
    result = run("consumer", "new", "team-a", "--max-databases", "5", "--token-file", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert TOKEN_RE.fullmatch(result.stdout.strip())
    assert hash_lines(tmp_path / "team-a.token-secret.yaml") == [sha256(result.stdout.strip())]


def test_a_quota_is_required_unless_refused_on_purpose(tmp_path: Path) -> None:
    refused = run("consumer", "new", "team-a", "--token-file", "-", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--max-databases" in refused.stderr and "--no-quota" in refused.stderr
    assert snapshot(tmp_path) == {}

    allowed = run("consumer", "new", "team-a", "--no-quota", "--token-file", "-", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    (consumer,) = read_docs(tmp_path / "team-a.consumer.yaml")
    assert "maxDatabases" not in consumer["spec"]
    assert "no maxDatabases" in allowed.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["Team_A", "--max-databases", "5"], "NAME"),
        (["team-a", "--max-databases", "-1"], "--max-databases"),
        (["team-a", "--max-databases", "5", "--namespace", "Databases"], "--namespace"),
        (["team-a", "--max-databases", "5", "--key", "sha/256"], "--key"),
        (["team-a", "--max-databases", "five"], "--max-databases"),
        (["team-a", "--max-databases", "5", "--no-quota"], "--no-quota"),
    ],
    ids=["name", "negative-quota", "namespace", "key", "quota-not-a-number", "quota-and-no-quota"],
)
def test_bad_input_exits_2_naming_the_argument_and_writes_nothing(tmp_path: Path, args: list[str], named: str) -> None:
    result = run("consumer", "new", *args, "--token-file", "tok", cwd=tmp_path)
    assert result.returncode == 2
    assert named in result.stderr
    assert snapshot(tmp_path) == {}


def test_existing_files_are_never_overwritten(tmp_path: Path) -> None:
    first = run("consumer", "new", "team-a", "--max-databases", "5", "--token-file", "-", cwd=tmp_path)
    assert first.returncode == 0
    before = snapshot(tmp_path)
    again = run("consumer", "new", "team-a", "--max-databases", "9", "--token-file", "new.token", cwd=tmp_path)
    assert again.returncode == 2
    assert "already exists" in again.stderr
    assert snapshot(tmp_path) == before  # neither the YAML nor a token file


def test_an_existing_token_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("keep me\n")
    result = run("consumer", "new", "team-a", "--max-databases", "5", "--token-file", "tok", cwd=tmp_path)
    assert result.returncode == 2
    assert snapshot(tmp_path) == {"tok": b"keep me\n"}


# -- consumer rotate --------------------------------------------------------------------------------------


def _new(tmp_path: Path) -> tuple[str, Path]:
    result = run("consumer", "new", "team-a", "--max-databases", "5", "--token-file", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), tmp_path / "team-a.token-secret.yaml"


def test_rotate_adds_a_line_so_both_tokens_work_then_drop_old_keeps_the_newest(tmp_path: Path) -> None:
    old, secret_file = _new(tmp_path)
    rotated = run_on_terminal("consumer", "rotate", "--secret-file", secret_file.name, cwd=tmp_path)
    assert rotated.returncode == 0, rotated.stderr
    (new,) = TOKEN_RE.findall(rotated.stdout)
    assert new != old
    assert hash_lines(secret_file) == [sha256(old), sha256(new)]
    assert new not in secret_file.read_text()

    dropped = run("consumer", "rotate", "--secret-file", str(secret_file), "--drop-old", cwd=tmp_path)
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout == ""  # no new token
    assert hash_lines(secret_file) == [sha256(new)]
    (secret,) = read_docs(secret_file)
    assert secret["metadata"] == {"name": "team-a-token", "namespace": "dbprovider"}


def test_rotate_keeps_base64_data_as_base64_and_the_other_documents(tmp_path: Path) -> None:
    first = "1" * 64
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep", "namespace": "databases"}}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "team-a-token", "namespace": "databases"},
        "data": {"sha256": b64(f"{first}\n")},
    }
    secret_file = write_yaml(tmp_path / "team-a.yaml", other, secret)
    result = run("consumer", "rotate", "--secret-file", str(secret_file), "--token-file", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    docs = read_docs(secret_file)
    assert docs[0] == other
    assert "stringData" not in docs[1]
    assert base64.b64decode(docs[1]["data"]["sha256"]).decode().split() == [first, sha256(result.stdout.strip())]


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n", [], "exactly one Secret"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\nstringData: {other: y}\n", [], "no key 'sha256'"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\ndata: {sha256: '%%%'}\n", [], "not valid base64"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: x\n", [], "not valid YAML"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\nstringData: {sha256: 'junk'}\n", ["--drop-old"], "no SHA"),
    ],
    ids=["no-secret", "no-key", "bad-base64", "bad-yaml", "drop-without-hash"],
)
def test_rotate_refuses_bad_files_and_leaves_them_alone(
    tmp_path: Path, content: str, extra: list[str], message: str
) -> None:
    secret_file = tmp_path / "s.yaml"
    secret_file.write_text(content)
    options = extra or ["--token-file", "tok"]
    result = run("consumer", "rotate", "--secret-file", str(secret_file), *options, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert snapshot(tmp_path) == {"s.yaml": content.encode()}


def test_rotate_on_a_pipe_needs_a_token_choice(tmp_path: Path) -> None:
    _, secret_file = _new(tmp_path)
    before = secret_file.read_bytes()
    result = run("consumer", "rotate", "--secret-file", str(secret_file), cwd=tmp_path)
    assert result.returncode == 2
    assert secret_file.read_bytes() == before


@pytest.mark.parametrize(
    "command", [["consumer"], ["consumer", "new"], ["consumer", "rotate"], ["lint"], ["dev"]], ids=" ".join
)
def test_every_command_explains_itself(tmp_path: Path, command: list[str]) -> None:
    result = run(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: dbprovider {' '.join(command)}")
