"""The statement-log reader refuses what it cannot read instead of counting zero statements: the
text log it used to parse with regexes read 0 statements per database in the benchmarks once the
line prefix changed."""

from __future__ import annotations

import json

import pytest

from harness.statement_log import MARK, parse_records, parse_statement_log

TEXT_LOG = (
    "2026-12-01 10:00:00.001 UTC [7] user=provisioner db=postgres app=dbprovider/a LOG:  statement: SELECT 1\n"
    "2026-12-01 10:00:00.002 UTC [7] user=provisioner db=postgres app=dbprovider/a LOG:  duration: 0.1 ms\n"
)


def test_a_text_log_is_refused_not_read_as_no_statements() -> None:
    with pytest.raises(ValueError, match="jsonlog"):
        parse_statement_log(TEXT_LOG)


def test_read_marks_are_no_records_and_other_roles_are_kept_apart() -> None:
    lines = [
        {
            "timestamp": "2026-12-01 10:00:00.001 UTC",
            "pid": 7,
            "user": "postgres",
            "error_severity": "LOG",
            "message": f"statement: DO $$BEGIN RAISE LOG '{MARK} 1'; END$$",
        },
        {
            "timestamp": "2026-12-01 10:00:00.002 UTC",
            "pid": 7,
            "user": "postgres",
            "error_severity": "LOG",
            "message": f"{MARK} 1",
        },
        {
            "timestamp": "2026-12-01 10:00:00.003 UTC",
            "pid": 8,
            "user": "provisioner",
            "error_severity": "LOG",
            "message": "execute <unnamed>: SELECT $1",
            "detail": "Parameters: $1 = 't_a'",
            "application_name": "dbprovider/a",
        },
        {
            "timestamp": "2026-12-01 10:00:00.004 UTC",
            "pid": 8,
            "user": "provisioner",
            "error_severity": "ERROR",
            "message": "statement: not logged as a statement",
        },
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    assert len(parse_records(text)) == 2
    (statement,) = parse_statement_log(text)
    assert (statement.user, statement.text, statement.parameters, statement.application) == (
        "provisioner",
        "SELECT $1",
        "$1 = 't_a'",
        "dbprovider/a",
    )
    assert parse_statement_log(text, "postgres") == []
