"""What every subcommand that works on files shares: exit statuses, bad-input errors, safe file writes,
and the one way a freshly made consumer token leaves the process.

Exit statuses: 0 done, 1 the command ran and found problems (lint), 2 bad input (nothing was written).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_INVALID = 2

TOKEN_TO_STDOUT = "-"

# `dbprovider lint --format`: one line per finding, or GitHub workflow-command annotations.
FORMAT_TEXT = "text"
FORMAT_GITHUB = "github"


class UsageError(ValueError):
    """Bad input: the command prints the message and exits with status 2, having written nothing."""


def subcommand(
    commands: Any, name: str, handler: Callable[[argparse.Namespace], int], *, help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand's parser (of `add_subparsers()`), whose `handler(args)` runs it and returns the exit status."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    parser.set_defaults(handler=handler)
    return parser


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` through a temporary file in the same directory: readers never see half a file."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class NewFiles:
    """Files created together or not at all: each is created exclusively (never overwrites), and if
    one fails the ones already written are removed again."""

    written: list[Path] = field(default_factory=list)

    def write(self, path: Path, text: str, mode: int = 0o644) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        self.written.append(path)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, mode)  # the umask may have narrowed it

    def undo(self) -> None:
        for path in reversed(self.written):
            path.unlink(missing_ok=True)
        self.written.clear()


def refuse_existing(*paths: Path) -> None:
    """Files this command creates must not exist yet: it never overwrites a token or a committed file."""
    for path in paths:
        if path.exists() or path.is_symlink():
            raise UsageError(f"{path} already exists; not overwriting it")


@dataclass(frozen=True)
class TokenSink:
    """Where a new consumer token goes, decided before anything is written.

    On a terminal it is printed there. When stdout is not a terminal (a pipe, a file, a CI log) the
    command refuses unless the user chose: `--token-file FILE` (created with mode 0600) or
    `--token-file -` (stdout carries the token and nothing else, e.g. `TOKEN=$(dbprovider ...)`).
    A token never goes into the YAML, a log, or stderr.
    """

    token_file: Path | None
    to_stdout: bool

    @classmethod
    def choose(cls, token_file: str | None, stdout: TextIO) -> TokenSink:
        if token_file == TOKEN_TO_STDOUT:
            return cls(None, True)
        if token_file:
            path = Path(token_file)
            refuse_existing(path)
            if not path.parent.is_dir():
                raise UsageError(f"--token-file {path}: directory {path.parent} does not exist")
            return cls(path, False)
        if not stdout.isatty():
            raise UsageError(
                "stdout is not a terminal, so the token would land in a file or a log. Pass --token-file FILE "
                "(written with mode 0600) or --token-file - (the token alone on stdout)"
            )
        return cls(None, False)

    def write_file(self, files: NewFiles, token: str) -> None:
        """Part of the command's file transaction: the token file is written with the YAML or not at all."""
        if self.token_file is not None:
            files.write(self.token_file, f"{token}\n", mode=0o600)

    def show(self, token: str, what: str, stdout: TextIO, stderr: TextIO) -> None:
        """After every file was written: tell the user where the token is, or print it (once)."""
        if self.token_file is not None:
            print(f"{what} written to {self.token_file} (mode 0600): deliver it, then delete the file", file=stderr)
        elif self.to_stdout:
            stdout.write(f"{token}\n")
            stdout.flush()
        else:
            stdout.write(f"{what} (shown once; deliver it through your secret channel, never chat or logs):\n")
            stdout.write(f"{token}\n")
            stdout.flush()
