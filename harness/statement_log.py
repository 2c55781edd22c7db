"""A PostgreSQL log written with log_statement=all, read back as the statements each role sent.

Tests use it to prove which SQL reached a shard, or that none did. The server logs a statement in
one of two shapes, and a reader that knows only the first misses most catalog reads:
- simple protocol (psycopg without bind parameters): `LOG:  statement: <text>`;
- extended protocol (every query with bind parameters, and any prepared one):
  `LOG:  execute <unnamed>: <text>` or `LOG:  execute <name>: <text>`, followed by an entry
  `DETAIL:  parameters: $1 = '...'` (`Parameters:` on newer servers) with the bound values.
A statement over several lines continues on the next lines of the file (the server indents them
with a tab); those lines belong to the entry above them. Entries are matched to the log line
prefix that `harness.postgres` configures: `%m [%p] user=%u db=%d app=%a `.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ENTRY = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[(\d+)\] user=(\S*) db=(\S*) (?:app=\S* )?(\w+):  (.*)$"
)
_STATEMENT = re.compile(r"^(?:statement|execute [^:]+): (.*)$", re.S)
_PARAMETERS = re.compile(r"^parameters: (.*)$", re.S | re.I)  # "Parameters:" on newer servers


@dataclass(frozen=True)
class LoggedStatement:
    """One statement as the server logged it: whitespace collapsed, bind values kept apart."""

    user: str
    text: str
    parameters: str = ""  # "$1 = 'x', $2 = '5'" for a parameterized statement, else ""
    pid: int = 0

    @property
    def keyword(self) -> str:
        """The first word, upper case (SELECT, CREATE, ALTER, GRANT, SET, ...)."""
        return self.text.split(None, 1)[0].upper() if self.text.strip() else ""

    def mentions(self, word: str) -> bool:
        """True if `word` is in the statement's text or in its bind values (a tenant name, say)."""
        return word in self.text or word in self.parameters


def parse_statement_log(text: str, user: str | None = None) -> list[LoggedStatement]:
    """Every statement in `text` (a server log, or the part of it after some point), in order."""
    entries: list[list[str]] = []  # [pid, user, level, message]
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if match:
            pid, user_, _db, level, message = match.groups()
            entries.append([pid, user_, level, message])
        elif entries:
            entries[-1][3] += "\n" + line
    found: list[LoggedStatement] = []
    last_of_pid: dict[str, int] = {}  # pid -> index in found of its last extended-protocol statement
    for pid, user_, level, message in entries:
        if level == "DETAIL":
            parameters = _PARAMETERS.match(message)
            index = last_of_pid.pop(pid, None)
            if parameters and index is not None:
                statement = found[index]
                found[index] = LoggedStatement(statement.user, statement.text, _collapse(parameters[1]), statement.pid)
            continue
        statement_match = _STATEMENT.match(message) if level == "LOG" else None
        last_of_pid.pop(pid, None)
        if statement_match is None:
            continue
        found.append(LoggedStatement(user_, _collapse(statement_match[1]), "", int(pid)))
        if message.startswith("execute "):
            last_of_pid[pid] = len(found) - 1
    return [s for s in found if user is None or s.user == user]


def _collapse(text: str) -> str:
    return " ".join(text.split())
