"""The command lines the README and docs/ show are run as written, so a renamed flag or a changed default
breaks a test instead of a reader.

A block is run when the line before it (blank lines apart) is `<!-- runnable -->`: a fenced ```sh block or
an indented one. A ```yaml block after `<!-- runnable file -->` whose first line is `# <path>` is written to
that path first. Each document runs in a scratch directory of its own, its blocks in order (a later line
may use what an earlier one wrote), each line with bash, stdout on a terminal as a user has it (the token
commands print on a terminal only), with the installed `dbprovider` first on PATH. Every line must exit 0.

Not run here: `dbprovider dev` (it starts servers; tests/env/test_dev_command.py runs it) and `pulumi`
(tests/pulumi runs those lines verbatim against real apiservers).

Every other shell block of the user docs (fenced as sh/bash/shell/console, or indented code whose first
word is a command) is marked, in the line before it, either `<!-- run by tests/<file> ... -->` (that test
runs it against what it starts: tests/support/documented.py) or `<!-- illustrative: <why> -->`, e.g.
`<!-- illustrative: needs a real cluster -->`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import Result, run_argv_on_terminal
from tests.support.documented import RUN_BY, block_after

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = "<!-- runnable -->"
RUNNABLE_FILE = "<!-- runnable file -->"
ILLUSTRATIVE = re.compile(r"<!-- illustrative: \S.*\S -->")
SHELL_FENCES = ("sh", "bash", "shell", "console")
# The first word of a line that makes an indented code block a shell block.
COMMANDS = frozenset(
    "kubectl dbprovider curl psql pulumi docker podman bash source make pip python python3 git helm flux "
    "vault export cd promtool go".split()
)
# Lines that need a live stack run where one is: tests/env (dev), tests/pulumi, tests/upgrade (upgrade check).
NOT_RUN_HERE = ("dbprovider dev", "pulumi ", "dbprovider upgrade check")
# The install values docs/install.md shows, also where the README's lines expect a values file.
VALUES_PATHS = ("values.yaml", "db-eu-1/values.yaml", "landscape/db-eu-1/dbprovider-values.yaml")
LANDSCAPE_DIRS = ("db-eu-1/shards", "db-eu-1/consumers")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # 1-based, of the block's first line
    length: int  # its number of lines
    text: str
    file: bool  # a file to write, not commands


def documented_blocks(document: Path) -> list[Block]:
    lines = document.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() in (RUNNABLE, RUNNABLE_FILE):
            first, body = block_after(lines, i + 1)
            text = "\n".join(body).strip() + "\n"
            blocks.append(Block(document, first, len(body), text, line.strip() == RUNNABLE_FILE))
    return blocks


def command_lines(block: Block) -> list[str]:
    """Shell lines of a block: continuations joined, comments and the lines run elsewhere left out."""
    joined = re.sub(r"\\\n\s*", "", block.text)
    lines = [line.strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#") and not line.startswith(NOT_RUN_HERE)]


def run_line(line: str, cwd: Path) -> Result:
    """`bash -c line` with stdout on a pseudo-terminal, the installed `dbprovider` first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return run_argv_on_terminal(["bash", "-c", line], cwd, env)


def install_values() -> str:
    """The install values file docs/install.md shows (its landscape/db-eu-1/dbprovider-values.yaml)."""
    (block,) = [b for b in documented_blocks(REPO / "docs" / "install.md") if b.file]
    return block.text


def prepare_landscape(root: Path) -> None:
    """What the documents assume a reader has: their values file and their landscape's folders."""
    for path in VALUES_PATHS:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(install_values())
    for folder in LANDSCAPE_DIRS:
        (root / folder).mkdir(parents=True, exist_ok=True)


def _write_file(block: Block, root: Path) -> None:
    first = block.text.splitlines()[0]
    assert first.startswith("# "), f"{block.document.name}:{block.line}: a runnable file starts with '# <path>'"
    path = root / first[2:].strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.text)


def _redirect_targets(line: str) -> list[str]:
    return re.findall(r"(?<![0-9&])>\s*([^\s|&;]+)", line)


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if documented_blocks(d)], ids=lambda d: d.name)
def test_the_documented_commands_run_as_written(document: Path, tmp_path: Path) -> None:
    prepare_landscape(tmp_path)
    ran = 0
    for block in documented_blocks(document):
        if block.file:
            _write_file(block, tmp_path)
            continue
        for line in command_lines(block):
            for target in _redirect_targets(line):  # the reader's repository has its folders
                (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
            result = run_line(line, tmp_path)
            assert result.returncode == 0, (
                f"{document.name}:{block.line}: `{line}` exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
            ran += 1
    assert ran, f"{document.name} marks blocks runnable but none has a line to run"


def test_every_dbprovider_line_of_the_landscape_sections_is_marked_runnable() -> None:
    """A new `dbprovider render|consumer|lint` example outside a runnable block would go unchecked."""
    unmarked = []
    for document in DOCUMENTS:
        marked = {n for block in documented_blocks(document) for n in range(block.line, block.line + block.length)}
        for number, line in enumerate(document.read_text().splitlines(), start=1):
            # a command line of a code block (fenced, or indented by four), not one inside a CI example
            if re.match(r"(    )?dbprovider (render|consumer|lint) ", line) and number not in marked:
                unmarked.append(f"{document.name}:{number}: {line.strip()}")
    assert not unmarked, "documented commands no test runs:\n" + "\n".join(unmarked)


def shell_blocks(document: Path) -> list[tuple[int, str]]:
    """(1-based line of the block's first line, the marker line before it) of every shell block: fenced
    as sh/bash/shell/console (or unlabelled, starting with a command), or indented code starting with one."""
    lines = document.read_text().splitlines()
    found = []

    def marker_before(i: int) -> str:
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        return lines[j].strip() if j >= 0 else ""

    def starts_with_command(text: str) -> bool:
        words = text.split()
        return bool(words) and words[0] in COMMANDS

    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            info = stripped[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            first = next((lines[j] for j in range(i + 1, end) if lines[j].strip()), "")
            if info in SHELL_FENCES or (not info and starts_with_command(first)):
                found.append((i + 1, marker_before(i)))
            i = end + 1
            continue
        if lines[i].startswith("    ") and starts_with_command(stripped) and (i == 0 or not lines[i - 1].strip()):
            found.append((i + 1, marker_before(i)))
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            continue
        i += 1
    return found


USER_DOCS = [d for d in DOCUMENTS if d.name not in ("performance.md", "development.md")]


def test_every_shell_block_of_the_user_docs_is_run_or_says_why_not() -> None:
    """A shell block a reader copies is either run by a test or marked illustrative with the reason."""
    unmarked, missing = [], []
    for document in USER_DOCS:
        for line, marker in shell_blocks(document):
            run_by = RUN_BY.fullmatch(marker)
            if run_by and not (REPO / run_by["test"]).is_file():
                missing.append(f"{document.name}:{line}: {run_by['test']} does not exist")
            elif not (marker == RUNNABLE or run_by or ILLUSTRATIVE.fullmatch(marker)):
                unmarked.append(
                    f"{document.name}:{line}: add `{RUNNABLE}`, `<!-- run by tests/<file> -->` (and make it run) "
                    "or `<!-- illustrative: <why> -->`"
                )
    assert not missing, "\n".join(missing)
    assert not unmarked, "shell blocks neither run nor marked illustrative:\n" + "\n".join(unmarked)
