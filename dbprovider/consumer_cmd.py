"""`dbprovider consumer new` and `consumer rotate`: a consumer's token steps (docs/install.md) as one command each.

Both work on files in the landscape repository and never touch a cluster; Flux applies what is
merged. The token is 256 random bits in hex (like `openssl rand -hex 32`); only its SHA-256 goes into
the Secret YAML, and the token itself leaves the process once, through `clitools.TokenSink`.
Every check runs before the first byte is written: bad input exits 2 and leaves the files as they were.
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from dbprovider.clitools import (
    EXIT_INVALID,
    EXIT_OK,
    NewFiles,
    TokenSink,
    UsageError,
    refuse_existing,
    write_atomically,
)
from dbprovider.landscape import (
    CONSUMER_FILE_SUFFIX,
    TOKEN_SECRET_FILE_SUFFIX,
    SecretValueError,
    consumer_object,
    hash_secret_object,
    is_secret,
    join_lines,
    read_secret_value,
    token_secret_name,
    write_secret_value,
)
from domain.naming import InvalidName, validate_dns1123_subdomain
from domain.specs import ConsumerSpec
from domain.tokens import SHA256_HEX_RE, hash_token
from domain.validation import validation_problems
from infra.render import dump_yaml

TOKEN_BYTES = 32  # 256 random bits: a token cannot be guessed

# Spec fields of a new Consumer, as the user spelled them on the command line.
_ARGUMENT_OF_FIELD = {
    "maxDatabases": "--max-databases",
    "tokenSecretRef.namespace": "--namespace",
    "tokenSecretRef.name": "NAME (its Secret is NAME-token)",
    "tokenSecretRef.key": "--key",
}


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


# -- consumer new -----------------------------------------------------------------------------------------


def _check_new(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Consumer and Secret objects, validated by the domain model the CRD is generated from."""
    if args.max_databases is None and not args.no_quota:
        raise UsageError(
            "--max-databases is required: without a quota a consumer can fill every shard (pass --no-quota "
            "to write a Consumer without one on purpose)"
        )
    problems: list[str] = []
    try:
        validate_dns1123_subdomain(args.name)
    except InvalidName as exc:
        problems.append(f"NAME {exc}")
    consumer = consumer_object(args.name, args.namespace, args.max_databases, args.key)
    try:
        ConsumerSpec.model_validate(consumer["spec"])
    except ValidationError as exc:
        for path, message in validation_problems(exc):
            if not (problems and path == "tokenSecretRef.name"):  # the NAME problem, said once
                problems.append(f"{_ARGUMENT_OF_FIELD.get(path, path)}: {message}")
    if problems:
        raise UsageError("; ".join(problems))
    return consumer, hash_secret_object(token_secret_name(args.name), args.namespace, [], args.key)


def run_new(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        consumer, secret = _check_new(args)
        directory = Path(args.out)
        if directory.exists() and not directory.is_dir():
            raise UsageError(f"--out {directory} is not a directory")
        consumer_file = directory / f"{args.name}{CONSUMER_FILE_SUFFIX}"
        secret_file = directory / f"{args.name}{TOKEN_SECRET_FILE_SUFFIX}"
        refuse_existing(consumer_file, secret_file)
        sink = TokenSink.choose(args.token_file, out)
    except UsageError as exc:
        print(f"dbprovider consumer new: {exc}", file=err)
        return EXIT_INVALID

    token = new_token()
    write_secret_value(secret, args.key, join_lines([hash_token(token)]), "stringData")
    directory.mkdir(parents=True, exist_ok=True)
    files = NewFiles()
    try:
        sink.write_file(files, token)
        files.write(secret_file, dump_yaml([secret]))
        files.write(consumer_file, dump_yaml([consumer]))
    except BaseException:
        files.undo()
        raise
    print(f"dbprovider consumer new: wrote {consumer_file} and {secret_file} (the hash only)", file=err)
    if args.no_quota:
        print("dbprovider consumer new: warning: the Consumer has no maxDatabases quota", file=err)
    sink.show(token, f"Token of consumer {args.name}", out, err)
    return EXIT_OK


# -- consumer rotate --------------------------------------------------------------------------------------


def _load_secret_file(path: Path) -> tuple[list[Any], dict[str, Any]]:
    """All documents of the file and the one hash Secret among them."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {type(exc).__name__}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path} is not valid YAML{where}") from None
    found = [doc for doc in docs if is_secret(doc)]
    if len(found) != 1:
        raise UsageError(f"{path} must hold exactly one Secret (apiVersion v1, kind Secret); it holds {len(found)}")
    return docs, found[0]


def _lines(value: str | bytes) -> list[str]:
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
    return [line.strip() for line in text.removeprefix("\ufeff").split("\n") if line.strip()]


def _is_hash(line: str) -> bool:
    return re.fullmatch(SHA256_HEX_RE, line) is not None


def run_rotate(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    path = Path(args.secret_file)
    try:
        docs, secret = _load_secret_file(path)
        try:
            value = read_secret_value(secret, args.key)
        except SecretValueError as exc:
            raise UsageError(f"{path}: {exc}") from None
        if value is None:
            raise UsageError(f"{path}: the Secret has no key {args.key!r} (in stringData or data); --key names it")
        lines = _lines(value.text)
        hashes = [line for line in lines if _is_hash(line)]
        if args.drop_old and not hashes:
            raise UsageError(f"{path}: no SHA-256 line to keep; run rotate without --drop-old first")
        sink = None if args.drop_old else TokenSink.choose(args.token_file, out)
    except UsageError as exc:
        print(f"dbprovider consumer rotate: {exc}", file=err)
        return EXIT_INVALID

    others = len(lines) - len(hashes)
    if args.drop_old:
        if lines == hashes[-1:]:
            print(f"dbprovider consumer rotate: {path} holds one hash only; nothing to drop", file=err)
            return EXIT_OK
        write_secret_value(secret, args.key, join_lines(hashes[-1:]), value.section)
        write_atomically(path, dump_yaml(docs), mode=path.stat().st_mode & 0o777)
        print(
            f"dbprovider consumer rotate: kept the newest hash, dropped {len(lines) - 1} line(s); once merged, "
            "only the newest token authenticates",
            file=err,
        )
        return EXIT_OK

    assert sink is not None
    token = new_token()
    write_secret_value(secret, args.key, join_lines([*lines, hash_token(token)]), value.section)
    files = NewFiles()
    try:
        sink.write_file(files, token)
        write_atomically(path, dump_yaml(docs), mode=path.stat().st_mode & 0o777)
    except BaseException:
        files.undo()
        raise
    print(
        f"dbprovider consumer rotate: added a hash line to {path} ({len(hashes) + 1} hashes); old and new tokens "
        "both work once merged. After the consumer has switched: consumer rotate --drop-old",
        file=err,
    )
    if others:
        print(
            f"dbprovider consumer rotate: warning: {others} line(s) are not SHA-256 digests and are ignored by the "
            "provider (a pasted token?); --drop-old removes them",
            file=err,
        )
    sink.show(token, "New token", out, err)
    return EXIT_OK
