"""The digest of a Docker build context: every file the tree's .dockerignore lets through, by path,
executable bit and content, plus the Dockerfile. hack/build-image.sh keys its image cache with it, so
an image is rebuilt exactly when something that goes into it changed.

    python3 hack/context_digest.py SOURCE_DIR      # prints the sha256 hex digest

The .dockerignore rules are Docker's (moby/patternmatcher): `*` and `?` stop at `/`, `**` spans
directories, a pattern also excludes everything under a directory it matches, `!` re-includes, and
the last matching line wins. Only the standard library: it runs before any virtualenv exists.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                body = pattern[i + 1 : end]
                out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
                i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def read_rules(source: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line of SOURCE/.dockerignore, in file order."""
    ignore = source / ".dockerignore"
    rules: list[tuple[bool, re.Pattern[str]]] = []
    if not ignore.is_file():
        return rules
    for raw in ignore.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        line = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        if line in ("", "."):
            continue
        rules.append((exception, _regex(line)))
    return rules


def excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether `path` (relative, with `/`) is left out of the context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for exception, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            verdict = not exception
    return verdict


def context_files(source: Path) -> list[str]:
    """The relative paths of the files in the build context, sorted."""
    rules = read_rules(source)
    prune = not any(exception for exception, _ in rules)  # with a `!` line, an excluded dir may hold kept files
    found: list[str] = []
    for directory, dirs, files in os.walk(source):
        rel_dir = os.path.relpath(directory, source)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        if prune:
            dirs[:] = [d for d in dirs if not excluded(rel_dir + d, rules)]
        found += [rel_dir + name for name in files if not excluded(rel_dir + name, rules)]
        found += [rel_dir + d for d in dirs if os.path.islink(os.path.join(directory, d))]
    return sorted(found)


def digest(source: Path, dockerfile: Path) -> str:
    total = hashlib.sha256()
    for rel in context_files(source):
        path = source / rel
        if path.is_symlink():
            entry = f"link {rel} {os.readlink(path)}"
        else:
            content = hashlib.sha256(path.read_bytes()).hexdigest()
            entry = f"file {rel} {os.stat(path).st_mode & 0o111:o} {content}"
        total.update(entry.encode("utf-8", "surrogateescape") + b"\n")
    total.update(b"Dockerfile " + hashlib.sha256(dockerfile.read_bytes()).hexdigest().encode() + b"\n")
    return total.hexdigest()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: context_digest.py SOURCE_DIR [DOCKERFILE]")
    src = Path(sys.argv[1])
    print(digest(src, Path(sys.argv[2]) if len(sys.argv) == 3 else src / "Dockerfile"))
