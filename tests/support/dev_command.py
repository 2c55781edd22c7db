"""Reading a running `dbprovider dev`: its ready line and the env file it writes (env and cli suites)."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of the env file (`export KEY=value` lines, shell-quoted)."""
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = shlex.split(value)[0]
    return values


def wait_ready_line(proc: subprocess.Popen, timeout: float) -> str:
    """Its output up to the line that says the stack is up (or up to `timeout`/its end)."""
    output = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output.append(line)
        if "Ctrl-C stops everything" in line:
            break
    return "".join(output)
