"""Shell blocks of the README and docs/ that a test runs: finding them by the marker line before them,
and running the ones marked for a live `dbprovider dev` against it.

A block's marker is the line before it (blank lines apart): `<!-- runnable -->` (run on files by
tests/cli/test_documented_commands.py), `<!-- run by tests/<file> ... -->` (run by that test against
what it starts), or `<!-- illustrative: <why> -->` (run by none, with the reason).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_BY = re.compile(r"<!-- run by (?P<test>tests/\S+\.py)\b.* -->")
DEV_TEST = "tests/env/test_dev_command.py"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub generates for the headings of a Markdown page."""
    anchors = set()
    for heading in re.findall(r"^#+ +(.+?) *$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def block_after(lines: list[str], start: int) -> tuple[int, list[str]]:
    """The code block that starts at or after line index `start` (blank lines skipped): its 1-based first
    line and its lines (a fenced block's content, or an indented block without the indent)."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if lines[i].strip().startswith("```"):
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        return i + 2, lines[i + 1 : end]
    indent = len(lines[i]) - len(lines[i].lstrip())
    body = []
    j = i
    while j < len(lines) and (len(lines[j]) - len(lines[j].lstrip()) >= indent or not lines[j].strip()):
        body.append(lines[j][indent:])
        j += 1
    return i + 1, body


def blocks_run_by(document: Path, test: str) -> list[str]:
    """The text of every block of `document` marked `<!-- run by <test> ... -->`, in order."""
    lines = document.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        match = RUN_BY.fullmatch(line.strip())
        if match and match["test"] == test:
            blocks.append("\n".join(block_after(lines, i + 1)[1]).strip() + "\n")
    return blocks


def run_documented_against_dev(state_dir: Path, workdir: Path, timeout: float = 180) -> None:
    """Run the README's and docs/api.md's blocks marked for `dbprovider dev`, as a reader does in a second
    shell: each document as one bash script (a later block uses an earlier one's variables), from a
    directory where `.dbprovider-dev` is the running stack's state, the documented `export` lines left
    out (their values come from the stack's env file). `curl` fails on an HTTP error, so every call must
    be answered with success."""
    (workdir / ".dbprovider-dev").symlink_to(state_dir)
    prelude = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; }\nsource .dbprovider-dev/env\n'
    for document in (REPO / "README.md", REPO / "docs" / "api.md"):
        blocks = blocks_run_by(document, DEV_TEST)
        assert blocks, f"{document.name} marks no block for {DEV_TEST}"
        script = prelude + "".join(
            "".join(line + "\n" for line in block.splitlines() if not line.startswith("export ")) for block in blocks
        )
        result = subprocess.run(
            ["bash", "-c", script], cwd=workdir, env=dict(os.environ), capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, (
            f"{document.name}'s commands failed against dbprovider dev (exit {result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )


def marked_lines(document: Path, test: str, section: str | None = None, *, runnable: bool = False) -> list[str]:
    """The lines of `document`'s blocks marked `<!-- run by <test> ... -->` (with `runnable`, also those marked
    `<!-- runnable -->`), in order, blank and comment lines left out; only under `## <section>` when given."""
    lines = document.read_text().splitlines()
    start = lines.index(f"## {section}") if section else 0
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)) if section else None
    found = []
    for i in range(start, end or len(lines)):
        run_by = RUN_BY.fullmatch(lines[i].strip())
        if (run_by and run_by["test"] == test) or (runnable and lines[i].strip() == "<!-- runnable -->"):
            found += [text.strip() for text in block_after(lines, i + 1)[1] if text.strip() and text[0] != "#"]
    assert found, f"{document.name}{f' ({section})' if section else ''} shows no command for {test}"
    return found


def file_block(document: Path, name: str) -> str:
    """The fenced block of `document` whose first line is `# <name>`: a file the reader is shown to write."""
    blocks = [block.split("\n", 1)[1] for block in document.read_text().split("```")[1::2]]
    (block,) = [b for b in blocks if b.startswith(f"# {name}\n")]
    return block
