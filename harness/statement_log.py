"""The one reader of what a PostgreSQL server logged: its jsonlog, read back as statements per role.

Tests and benchmarks use it to prove which SQL reached a shard, or that none did; nothing else
parses a server log. Every harness server (PostgreSQL 15+) writes `log_destination=jsonlog`
(`harness.postgres`): one JSON object per line with the role (`user`), the backend's `pid`,
`application_name`, `timestamp`, `message` and `detail`, so nothing depends on a line prefix, and a
statement over several lines, or one whose text looks like a log line, stays one record.

With `log_statement=all` a statement is logged before it runs, in one of two shapes:
- simple protocol (psycopg without bind parameters): message `statement: <text>`;
- extended protocol (every query with bind parameters, and any prepared one): message
  `execute <unnamed>: <text>` or `execute <name>: <text>`, its bound values in the same record's
  `detail` (`Parameters: $1 = '...'`).
With `log_min_duration_statement=0` as well, each statement that finished is followed by a record
`duration: <ms> ms` of the same backend (the parse and bind steps of the extended protocol log
`duration: <ms> ms  parse|bind <name>: <text>` records too: they are not statements).

The collector process writes the file a moment after a backend logged: `StatementLog` waits for a
mark of its own (`PostgresServer.mark_log`) when it starts and before each read, so what was logged
before it started is not in what it reads, and everything logged before a read is.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

MARK = "dbprovider-log-mark"  # RAISE LOG text of a read's mark (harness.postgres): never a statement
_STATEMENT = re.compile(r"^(?:statement|execute [^:]+): (.*)$", re.S)
_PARAMETERS = re.compile(r"^parameters: (.*)$", re.S | re.I)  # "Parameters:" on 15+
_DURATION = re.compile(r"^duration: [\d.]+ ms$")  # a statement finished (not "duration: ... parse ...")


@dataclass(frozen=True)
class LogRecord:
    """One record of the jsonlog, the fields the readers use."""

    time: datetime
    pid: int
    user: str
    database: str
    application: str
    severity: str
    message: str
    detail: str = ""


@dataclass(frozen=True)
class LoggedStatement:
    """One statement as the server logged it: whitespace collapsed, bind values kept apart."""

    user: str
    text: str
    parameters: str = ""  # "$1 = 'x', $2 = '5'" for a parameterized statement, else ""
    pid: int = 0
    application: str = ""
    time: datetime | None = None
    finished: bool = False  # a `duration:` record followed (only with log_min_duration_statement=0)

    @property
    def keyword(self) -> str:
        """The first word, upper case (SELECT, CREATE, ALTER, GRANT, SET, ...)."""
        return self.text.split(None, 1)[0].upper() if self.text.strip() else ""

    def mentions(self, word: str) -> bool:
        """True if `word` is in the statement's text or in its bind values (a tenant name, say)."""
        return word in self.text or word in self.parameters


def parse_records(text: str) -> list[LogRecord]:
    """Every record of jsonlog `text`, without our own read marks.

    A line that is no JSON is skipped: the last one the collector is still writing, or one a killed
    server cut off. A text without a single JSON line is refused: it is not a jsonlog.
    """
    records = []
    parsed = broken = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            broken += 1
            continue
        parsed += 1
        message = entry.get("message") or ""
        if MARK in message:
            continue
        records.append(
            LogRecord(
                time=_timestamp(entry.get("timestamp", "")),
                pid=int(entry.get("pid") or 0),
                user=entry.get("user") or "",
                database=entry.get("dbname") or "",
                application=entry.get("application_name") or "",
                severity=entry.get("error_severity") or "",
                message=message,
                detail=entry.get("detail") or "",
            )
        )
    if broken > 1 and not parsed:
        raise ValueError("not a jsonlog (is log_destination=jsonlog set?): no line is JSON")
    return records


def log_text(records: list[LogRecord]) -> str:
    """Every record's message and detail, decoded, one record per line: search it for a secret."""
    return "\n".join(f"{r.message}\n{r.detail}" if r.detail else r.message for r in records)


def statements_of(records: list[LogRecord], user: str | None = None) -> list[LoggedStatement]:
    """The statements among `records`, in order (of `user` only, if given)."""
    found: list[LoggedStatement] = []
    last_of_pid: dict[int, int] = {}  # pid -> index in found of its last statement
    for record in records:
        if record.severity != "LOG":
            continue
        if _DURATION.match(record.message):
            index = last_of_pid.pop(record.pid, None)
            if index is not None:
                found[index] = replace(found[index], finished=True)
            continue
        match = _STATEMENT.match(record.message)
        if match is None:
            continue
        parameters = _PARAMETERS.match(record.detail)
        last_of_pid[record.pid] = len(found)
        found.append(
            LoggedStatement(
                user=record.user,
                text=_collapse(match[1]),
                parameters=_collapse(parameters[1]) if parameters else "",
                pid=record.pid,
                application=record.application,
                time=record.time,
            )
        )
    return [s for s in found if user is None or s.user == user]


def parse_statement_log(text: str, user: str | None = None) -> list[LoggedStatement]:
    """Every statement in jsonlog `text` (a whole log, or the part of it after some point), in order."""
    return statements_of(parse_records(text), user)


def keywords(statements: list[LoggedStatement], detail: bool = False) -> Counter[str]:
    """Statements counted by first keyword (SELECT, CREATE, ...), or with `detail` by their first
    72 characters (which SELECT: the Shard check's or the tenant state read)."""
    return Counter(" ".join(s.text.split())[:72] if detail else s.keyword for s in statements)


class LoggingServer(Protocol):
    """What `StatementLog` needs of a server (`harness.PostgresServer`)."""

    json_log_file: Path

    def mark_log(self) -> None: ...


class StatementLog:
    """What a server logs from now on: created before the work, read after it."""

    def __init__(self, server: LoggingServer) -> None:
        self.server = server
        self.path = server.json_log_file
        server.mark_log()  # what was logged before now is in the file, and before the offset
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def raw(self) -> str:
        """The jsonlog lines written since this point (everything logged before this call)."""
        self.server.mark_log()
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            return handle.read().decode(errors="replace")

    def records(self) -> list[LogRecord]:
        return parse_records(self.raw())

    def statements(self, user: str | None = None) -> list[LoggedStatement]:
        return statements_of(self.records(), user)

    def text(self) -> str:
        """Every record's message and detail since this point, decoded (see `log_text`)."""
        return log_text(self.records())


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _timestamp(value: str) -> datetime:
    """jsonlog's `2026-12-01 10:00:00.123 UTC` (the harness logs in UTC)."""
    try:
        return datetime.strptime(value.removesuffix(" UTC"), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
