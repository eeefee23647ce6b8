"""``aigcq tasks list --since``: an age, a clock time or an ISO date and time."""

from __future__ import annotations

from datetime import datetime

import pytest

from aigcq.cli.remote import InputError
from aigcq.cli.tasks import since_time

NOW = datetime(2026, 1, 31, 14, 30, 0).timestamp()  # local time


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("30s", NOW - 30),
        ("10m", NOW - 600),
        ("1.5h", NOW - 5400),
        ("2d", NOW - 2 * 86400),
        ("14:05", datetime(2026, 1, 31, 14, 5).timestamp()),
        ("14:05:30", datetime(2026, 1, 31, 14, 5, 30).timestamp()),
        ("15:00", datetime(2026, 1, 30, 15, 0).timestamp()),  # still to come today: yesterday's
        ("2026-01-30T09:00", datetime(2026, 1, 30, 9, 0).timestamp()),
        ("2026-01-30 09:00", datetime(2026, 1, 30, 9, 0).timestamp()),
        ("2026-01-30T09:00:00+00:00", datetime.fromisoformat("2026-01-30T09:00+00:00").timestamp()),
    ],
)
def test_since_reads_ages_clock_times_and_dates(given: str, expected: float) -> None:
    assert since_time(given, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("given", ["yesterday", "10", "10 minutes", "25:00", "-5m"])
def test_anything_else_is_refused_naming_the_forms(given: str) -> None:
    with pytest.raises(InputError, match=r"--since: .* is no time \(30s, 10m, 2h, 1d ago"):
        since_time(given, NOW)
