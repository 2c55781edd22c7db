"""A claim's spec.rotation.overlap: what the agent asks the provider for, and its bounds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from domain.specs import ClaimRotation


def test_the_overlap_defaults_to_ten_minutes_and_zero_is_none() -> None:
    assert ClaimRotation().overlap_seconds == 600
    assert ClaimRotation.model_validate({"overlap": "90s"}).overlap_seconds == 90
    assert ClaimRotation.model_validate({"overlap": "0s"}).overlap_seconds == 0


@pytest.mark.parametrize("value", ["2d", "25h", "-1s"])
def test_an_overlap_beyond_a_day_is_refused(value: str) -> None:
    with pytest.raises(ValidationError):
        ClaimRotation.model_validate({"overlap": value})
