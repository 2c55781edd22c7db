"""Which client tools a move copies with (reconciler.move.tools): those of the target shard's major, from
a directory of per-major tool directories laid out as the image lays them out, here made of the
harness's real PostgreSQL builds (each binary's major is read from its `--version`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import POSTGRES_FLAVORS
from reconciler.move.tools import DEFAULT_PG_TOOLS, ClientTools, MoveTools
from tests.support.postgres import client_tools_root


def tools(root: Path, *majors: str, **overrides: Path) -> ClientTools:
    """Tools of `majors` under `root` and nothing else (not the test runner's PATH)."""
    return ClientTools(root=client_tools_root(root, *majors), search_path=False, **overrides)


def build(major: str, tool: str) -> Path:
    return POSTGRES_FLAVORS[major].locate() / tool


def test_a_move_copies_with_the_tools_of_the_targets_major(tmp_path: Path) -> None:
    every = tools(tmp_path, "18", "16", "15")
    into_16 = every.for_move(16, 16)
    assert into_16 == MoveTools(16, tmp_path / "16/bin/pg_dump", tmp_path / "16/bin/pg_restore")
    assert every.for_move(15, 18) == MoveTools(18, tmp_path / "18/bin/pg_dump", tmp_path / "18/bin/pg_restore")
    assert every.for_move(15, 15) == MoveTools(15, tmp_path / "15/bin/pg_dump", tmp_path / "15/bin/pg_restore")
    # Without the target's major, the newest one between the two majors.
    assert isinstance(without_17 := every.for_move(16, 17), MoveTools) and without_17.major == 16


def test_without_tools_of_a_fitting_major_the_move_says_what_is_missing(tmp_path: Path) -> None:
    only_18 = tools(tmp_path, "18")
    refused = only_18.for_move(16, 16)
    assert isinstance(refused, str)
    assert "no pg_dump of PostgreSQL 16 where the manager runs" in refused
    assert str(tmp_path / "16" / "bin") in refused
    assert isinstance(only_18.for_move(15, 18), MoveTools)


def test_a_move_to_an_older_major_is_refused_whatever_tools_there_are(tmp_path: Path) -> None:
    refused = tools(tmp_path, "18", "16").for_move(18, 16)
    assert isinstance(refused, str)
    assert "runs PostgreSQL 16, older than the source's 18" in refused


def test_the_named_binaries_are_used_where_their_major_fits(tmp_path: Path) -> None:
    dump_18, restore_15 = build("18", "pg_dump"), build("15", "pg_restore")
    named = tools(tmp_path, "16", "15", pg_dump=dump_18, pg_restore=restore_15)
    assert named.for_move(15, 18) == MoveTools(18, dump_18, restore_15)
    # 15's pg_restore does not fit a move from 16: the one beside the named pg_dump does it.
    assert named.for_move(16, 18) == MoveTools(18, dump_18, build("18", "pg_restore"))
    # PostgreSQL 18's pg_dump does not fit a move into 16: the directory's tools of 16 do it.
    assert named.for_move(16, 16) == MoveTools(16, tmp_path / "16/bin/pg_dump", tmp_path / "16/bin/pg_restore")
    # pg_restore beside the named pg_dump, when none is named.
    assert tools(tmp_path / "other", pg_dump=dump_18).for_move(18, 18) == MoveTools(
        18, dump_18, build("18", "pg_restore")
    )


def test_the_environment_configures_where_the_tools_are(tmp_path: Path) -> None:
    assert ClientTools.from_environment({}) == ClientTools(root=DEFAULT_PG_TOOLS)
    configured = ClientTools.from_environment(
        {"DBPROVIDER_PG_TOOLS": str(tmp_path), "DBPROVIDER_PG_DUMP": "/x/pg_dump", "DBPROVIDER_PG_RESTORE": ""}
    )
    assert configured == ClientTools(root=tmp_path, pg_dump=Path("/x/pg_dump"))


@pytest.mark.parametrize("major", ["18", "16", "15"])
def test_an_online_move_needs_no_pg_restore(tmp_path: Path, major: str) -> None:
    """A tool directory with pg_dump only: the move has its pg_dump and no pg_restore."""
    (tmp_path / major / "bin").mkdir(parents=True)
    (tmp_path / major / "bin" / "pg_dump").symlink_to(build(major, "pg_dump"))
    chosen = ClientTools(root=tmp_path, search_path=False).for_move(int(major), int(major))
    assert chosen == MoveTools(int(major), tmp_path / major / "bin" / "pg_dump", None)
