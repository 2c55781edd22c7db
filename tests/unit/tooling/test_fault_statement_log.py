"""The fault suite's statement-log reader: a statement counts as done only once it took effect.

A shard killed between CREATE ROLE and the COMMIT of its transaction rolls the role back, and the
retry's CREATE ROLE is the first that took effect: the "no tenant DDL twice" invariant must not
count the rolled-back one (it did, and failed at random in CI). The shards log jsonlog with
log_min_duration_statement=0: a `duration:` record of the same backend says a statement finished.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.faults.support import statement_log


def _record(n: int, pid: int, message: str) -> str:
    return json.dumps(
        {
            "timestamp": f"2026-12-01 10:00:00.{n:03d} UTC",
            "user": "provisioner",
            "dbname": "postgres",
            "pid": pid,
            "error_severity": "LOG",
            "message": message,
            "application_name": "dbprovider/a",
            "backend_type": "client backend",
        }
    )


def _log(*lines: tuple[int, str]) -> str:
    return "\n".join(_record(i, pid, text) for i, (pid, text) in enumerate(lines)) + "\n"


def _done(log: str) -> list[tuple[str, bool]]:
    stack = SimpleNamespace(shards={"a": SimpleNamespace(statement_log=lambda: log)})
    return [(statement, completed) for _, _, statement, _, completed in statement_log(stack)]


def test_statements_of_a_transaction_cut_off_before_commit_did_not_take_effect() -> None:
    log = _log(
        (1, "statement: BEGIN"),
        (1, "duration: 0.100 ms"),
        (1, 'statement: CREATE ROLE "t1" LOGIN'),
        (1, "duration: 0.100 ms"),
        (1, "statement: COMMENT ON ROLE \"t1\" IS 'x'"),
        (1, "duration: 0.100 ms"),
        # killed here; the retry on a new backend commits
        (2, "statement: BEGIN"),
        (2, "duration: 0.100 ms"),
        (2, 'statement: CREATE ROLE "t1" LOGIN'),
        (2, "duration: 0.100 ms"),
        (2, "statement: COMMIT"),
        (2, "duration: 0.100 ms"),
    )
    create_role = [completed for statement, completed in _done(log) if statement.startswith("CREATE ROLE")]
    assert create_role == [False, True]


def test_autocommit_statements_and_rollbacks() -> None:
    log = _log(
        (1, 'statement: ALTER ROLE "t1" NOLOGIN'),
        (1, "duration: 0.100 ms"),
        (1, 'statement: DROP DATABASE "t1"'),  # no duration: cut off
        (2, "statement: BEGIN"),
        (2, "duration: 0.100 ms"),
        (2, 'statement: DROP ROLE "t2"'),
        (2, "duration: 0.100 ms"),
        (2, "statement: ROLLBACK"),
        (2, "duration: 0.100 ms"),
    )
    done = dict(_done(log))
    assert done['ALTER ROLE "t1" NOLOGIN'] is True
    assert done['DROP DATABASE "t1"'] is False
    assert done['DROP ROLE "t2"'] is False


def test_parse_and_bind_durations_are_not_statements_and_a_cut_line_is_skipped() -> None:
    """The extended protocol logs `duration: ... parse|bind <name>: <text>` before the execute: no
    statement of its own, no completion of the previous one. A crash can cut the last line short."""
    log = (
        _log(
            (1, "duration: 0.200 ms  parse <unnamed>: SELECT $1"),
            (1, "duration: 0.050 ms  bind <unnamed>: SELECT $1"),
            (1, "execute <unnamed>: SELECT $1"),
            (1, "duration: 0.010 ms"),
            (3, 'statement: CREATE DATABASE "t3"'),
            (3, "duration: 0.100 ms  bind <unnamed>: SELECT 1"),  # not the CREATE's completion
        )
        + '{"timestamp":"2026-12-01 10:00:01.000 UTC","pid":3,"message":"duration: 0.1'
    )
    assert _done(log) == [("SELECT $1", True), ('CREATE DATABASE "t3"', False)]
