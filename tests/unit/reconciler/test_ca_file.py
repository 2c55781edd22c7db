"""A CA's PEM as a file for libpq: exactly its content, one file per content, shared by later calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.sql.ca_file import ca_file
from tests.vectors.objects import CA_PEM


def test_one_file_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    first = ca_file(CA_PEM)
    assert Path(first).read_text() == CA_PEM
    assert ca_file(CA_PEM) == first
    renewed = ca_file(CA_PEM + CA_PEM)
    assert renewed != first and Path(renewed).read_text() == CA_PEM + CA_PEM
    assert sorted(p.name for p in Path(first).parent.iterdir()) == sorted([Path(first).name, Path(renewed).name])
