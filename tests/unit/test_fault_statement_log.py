"""The fault suite's statement-log reader: a statement counts as done only once it took effect.

A shard killed between CREATE ROLE and the COMMIT of its transaction rolls the role back, and the
retry's CREATE ROLE is the first that took effect: the "no tenant DDL twice" invariant must not
count the rolled-back one (it did, and failed at random in CI).
"""

from __future__ import annotations

from types import SimpleNamespace

from tests.faults.support import statement_log

PREFIX = "2026-12-01 10:00:00.{ms:03d} UTC [{pid}] user=provisioner db=postgres app=dbprovider/a LOG:  "


def _log(*lines: tuple[int, str]) -> str:
    return "\n".join(PREFIX.format(ms=i, pid=pid) + text for i, (pid, text) in enumerate(lines))


def _done(log: str) -> list[tuple[str, bool]]:
    stack = SimpleNamespace(shards={"a": SimpleNamespace(statement_log=lambda: log)})
    return [(statement, completed) for _, _, statement, _, completed in statement_log(stack)]


def test_statements_of_a_transaction_cut_off_before_commit_did_not_take_effect() -> None:
    log = _log(
        (1, "statement: BEGIN"),
        (1, "duration: 0.1 ms"),
        (1, 'statement: CREATE ROLE "t1" LOGIN'),
        (1, "duration: 0.1 ms"),
        (1, "statement: COMMENT ON ROLE \"t1\" IS 'x'"),
        (1, "duration: 0.1 ms"),
        # killed here; the retry on a new backend commits
        (2, "statement: BEGIN"),
        (2, "duration: 0.1 ms"),
        (2, 'statement: CREATE ROLE "t1" LOGIN'),
        (2, "duration: 0.1 ms"),
        (2, "statement: COMMIT"),
        (2, "duration: 0.1 ms"),
    )
    create_role = [completed for statement, completed in _done(log) if statement.startswith("CREATE ROLE")]
    assert create_role == [False, True]


def test_autocommit_statements_and_rollbacks() -> None:
    log = _log(
        (1, 'statement: ALTER ROLE "t1" NOLOGIN'),
        (1, "duration: 0.1 ms"),
        (1, 'statement: DROP DATABASE "t1"'),  # no duration: cut off
        (2, "statement: BEGIN"),
        (2, "duration: 0.1 ms"),
        (2, 'statement: DROP ROLE "t2"'),
        (2, "duration: 0.1 ms"),
        (2, "statement: ROLLBACK"),
        (2, "duration: 0.1 ms"),
    )
    done = dict(_done(log))
    assert done['ALTER ROLE "t1" NOLOGIN'] is True
    assert done['DROP DATABASE "t1"'] is False
    assert done['DROP ROLE "t2"'] is False
