"""The one duration format of the CLI and the dashboard."""

from __future__ import annotations

import math

import pytest

from hopsmgr.cli.text import duration as cli_duration
from hopsmgr.durations import duration
from hopsmgr.master.dashboard.render import duration as page_duration


@pytest.mark.parametrize(
    ("seconds", "plain", "spaced"),
    [
        (0, "0s", "0s"),
        (-5, "0s", "0s"),
        (44.6, "45s", "45s"),
        (59.6, "1m00s", "1m 00s"),
        (200, "3m20s", "3m 20s"),
        (3900, "1h05m", "1h 05m"),
        (14 * 86400, "14d00h", "14d 00h"),
        (2 * 86400 + 3 * 3600 + 59 * 60, "2d03h", "2d 03h"),
    ],
)
def test_two_largest_units_rounded_to_the_second(seconds: float, plain: str, spaced: str) -> None:
    assert duration(seconds) == plain == cli_duration(seconds)
    assert duration(seconds, " ") == spaced == page_duration(seconds)


def test_no_number_reads_as_each_front_ends_dash() -> None:
    assert duration(math.inf) is None and duration(math.nan) is None
    assert cli_duration(None) == cli_duration(math.inf) == "-"
    assert page_duration(None) == page_duration(math.inf) == "–"
