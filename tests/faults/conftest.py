"""The fault suite's stack: its own control plane, two PostgreSQL 18 shards and manager replicas.

Every process is the suite's own (no shared session fixture is paused or killed). The measured
times are printed at the end of the run and, with DBPROVIDER_FAULT_TIMINGS=<file>, written as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.support import TIMINGS, FaultStack


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    created = FaultStack(tmp_path_factory.mktemp("faults")).start()
    try:
        # The suite kills its shards: acknowledged commits must survive that, as on a real shard.
        for server in created.shards.values():
            assert server.query("SHOW synchronous_commit") == [("on",)]
        yield created
    finally:
        created.close()


@pytest.fixture
def owned(stack: FaultStack) -> Iterator[FaultStack]:
    """The stack, with every replica a test started stopped again after it (the Lease released)."""
    before = len(stack.replicas)
    yield stack
    for replica in stack.replicas[before:]:
        replica.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TIMINGS:
        return
    terminalreporter.section("fault suite: measured times (seconds)")
    for row in TIMINGS:
        terminalreporter.write_line(f"{row['fault']:<40} {row['what']:<48} {row['seconds']:>6.1f}")
    target = os.environ.get("DBPROVIDER_FAULT_TIMINGS")
    if target:
        Path(target).write_text(json.dumps(TIMINGS, indent=2) + "\n")
