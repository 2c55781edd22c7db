"""The PostgreSQL client tools a move copies with: `pg_dump` and `pg_restore` of the target shard's major.

pg_dump reads servers of its own major and older, and what it writes (the schema an online move
replays, the archive an offline move restores) uses settings and syntax of its own major, which older
servers refuse. So a move from PostgreSQL S to PostgreSQL T copies with tools of a major M with
S <= M <= T, the target's own first; a move to an older major (T < S) cannot be copied at all.

Where each tool is looked for, the first whose major fits the move winning:
- the binary named by DBPROVIDER_PG_DUMP (DBPROVIDER_PG_RESTORE);
- for pg_restore, the one beside the chosen pg_dump (the same release);
- DBPROVIDER_PG_TOOLS (default /opt/postgresql, where the image carries them): a directory holding one
  directory per major, `<major>/bin/pg_dump`, the target's major first, then the older ones down to the
  source's;
- the one on PATH.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.sql.move_offline import client_major

PG_DUMP_VARIABLE = "DBPROVIDER_PG_DUMP"
PG_RESTORE_VARIABLE = "DBPROVIDER_PG_RESTORE"
PG_TOOLS_VARIABLE = "DBPROVIDER_PG_TOOLS"
DEFAULT_PG_TOOLS = Path("/opt/postgresql")


def direction_obstacle(source_major: int, target_major: int) -> str | None:
    """Why a database of PostgreSQL `source_major` cannot move to a shard of `target_major`, or None."""
    if target_major >= source_major:
        return None
    return (
        f"the target shard runs PostgreSQL {target_major}, older than the source's {source_major}: a database "
        "moves only to a shard of the same or a newer major (a dump of a newer server does not restore into "
        "an older one)"
    )


@dataclass(frozen=True)
class MoveTools:
    """The tools one move copies with: `major` is pg_dump's; `pg_restore` None when none fits (an
    online move does without it)."""

    major: int
    pg_dump: Path
    pg_restore: Path | None


@dataclass(frozen=True)
class ClientTools:
    """Where the manager finds client tools: `root` (the per-major directories), the `pg_dump` and
    `pg_restore` named explicitly, and, with `search_path`, the manager's PATH."""

    root: Path | None = None
    pg_dump: Path | None = None
    pg_restore: Path | None = None
    search_path: bool = True

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> ClientTools:
        """As the manager's environment configures them (DBPROVIDER_PG_TOOLS, DBPROVIDER_PG_DUMP, ...)."""
        dump, restore = environ.get(PG_DUMP_VARIABLE), environ.get(PG_RESTORE_VARIABLE)
        return cls(
            root=Path(environ.get(PG_TOOLS_VARIABLE) or DEFAULT_PG_TOOLS),
            pg_dump=Path(dump) if dump else None,
            pg_restore=Path(restore) if restore else None,
        )

    def for_move(self, source_major: int, target_major: int) -> MoveTools | str:
        """The tools that copy a database from PostgreSQL `source_major` to `target_major`, or why there
        are none (a message for the move's condition)."""
        refused = direction_obstacle(source_major, target_major)
        if refused is not None:
            return refused

        def fitting(tool: str, *first: Path | None) -> Path | None:
            for candidate in self._candidates(tool, source_major, target_major, first):
                if candidate.is_file() and source_major <= client_major(candidate) <= target_major:
                    return candidate
            return None

        dump = fitting("pg_dump", self.pg_dump)
        if dump is None:
            return (
                f"no pg_dump of PostgreSQL {_majors(source_major, target_major)} where the manager runs "
                f"(looked in {self._places(target_major)}); a move from PostgreSQL {source_major} to "
                f"{target_major} copies with the client tools of the target's major"
            )
        restore = fitting("pg_restore", self.pg_restore, dump.with_name("pg_restore"))
        return MoveTools(client_major(dump), dump, restore)

    def _candidates(self, tool: str, source: int, target: int, first: tuple[Path | None, ...]) -> Iterator[Path]:
        yield from (path for path in first if path is not None)
        if self.root is not None:
            yield from (self.root / str(major) / "bin" / tool for major in range(target, source - 1, -1))
        if self.search_path and (found := shutil.which(tool)):
            yield Path(found)

    def _places(self, target: int) -> str:
        places = [f"{PG_DUMP_VARIABLE}={self.pg_dump}"] if self.pg_dump is not None else []
        places += [str(self.root / str(target) / "bin")] if self.root is not None else []
        return ", ".join([*places, "PATH"] if self.search_path else places)


def _majors(source: int, target: int) -> str:
    return str(target) if source == target else f"{source} to {target}"
