"""`make test-fast` runs the tests that need no server, and fails loudly when one starts a server anyway."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.process import NO_SERVERS_ENV, spawn


def test_a_server_started_in_the_fast_tier_fails_naming_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NO_SERVERS_ENV, "1")
    with pytest.raises(RuntimeError, match=r"sleep started in a run without servers.*pytest\.mark\.server"):
        spawn(["sleep", "60"], tmp_path / "sleep.log")


def test_outside_the_fast_tier_processes_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_SERVERS_ENV, raising=False)
    proc = spawn(["true"], tmp_path / "true.log")
    assert proc.wait(timeout=10) == 0
