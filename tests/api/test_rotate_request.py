"""The rotate request's overlap: the body's, else the install's `rotation.defaultOverlap`; none with
terminateSessions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.errors import InvalidBody
from api.models import parse_rotate_body
from domain.config import InstallConfig
from tests.support.install import release_config

JSON = "application/json"


def config(default_overlap: str | None = None) -> InstallConfig:
    settings = {} if default_overlap is None else {"rotation": {"defaultOverlap": default_overlap}}
    return InstallConfig.model_validate(release_config("rot", "rot-system", **settings))


def test_without_a_default_a_rotation_has_no_overlap() -> None:
    assert parse_rotate_body(b"", None).overlap(config()) == 0


def test_the_install_default_applies_when_the_body_names_none() -> None:
    assert parse_rotate_body(b"", None).overlap(config("10m")) == 600
    assert parse_rotate_body(b'{"overlapSeconds": 30}', JSON).overlap(config("10m")) == 30
    assert parse_rotate_body(b'{"overlapSeconds": 0}', JSON).overlap(config("10m")) == 0


def test_terminate_sessions_means_no_overlap_whatever_the_default() -> None:
    assert parse_rotate_body(b'{"terminateSessions": true}', JSON).overlap(config("10m")) == 0
    with pytest.raises(InvalidBody):
        parse_rotate_body(b'{"terminateSessions": true, "overlapSeconds": 5}', JSON)


@pytest.mark.parametrize("value", ["-1s", "2d", "1500ms"])
def test_the_install_default_is_bounded(value: str) -> None:
    with pytest.raises(ValidationError, match="defaultOverlap"):
        config(value)
