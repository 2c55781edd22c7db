"""The upgrade suite: the previous release, built from its commit, next to this checkout's code."""

from __future__ import annotations

import pytest

from harness.releases import BuiltRelease, build


@pytest.fixture(scope="session")
def previous() -> BuiltRelease:
    """The newest release in releases.yaml, exported from git and installed in its own virtualenv."""
    return build()
