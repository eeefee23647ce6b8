"""A Redis outage is reported once per loop (again every ``OUTAGE_REPORT_S`` while it lasts,
and once when Redis is back), not once per round; a bug still gets its traceback."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from aigcq.plumbing import background
from aigcq.plumbing.background import one_round

log = logging.getLogger("aigcq.test.outage")


def _rounds(n: int, exc: Exception | None) -> None:
    for _ in range(n):
        with one_round(log, "a loop"):
            if exc is not None:
                raise exc


def test_an_outage_is_one_line_then_one_when_it_is_over(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(background.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger=log.name):
        _rounds(50, RedisConnectionError("refused"))
        assert [r.getMessage() for r in caplog.records] == [
            "a loop: Redis unavailable (refused); trying again"
        ]
        clock[0] += background.OUTAGE_REPORT_S
        _rounds(5, RedisConnectionError("refused"))
        assert caplog.records[-1].getMessage() == (
            "a loop: Redis unavailable (still) (refused); trying again"
        )
        _rounds(3, None)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[2:] == ["a loop: Redis reachable again"] and len(messages) == 3


def test_a_bug_is_logged_with_its_traceback_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=log.name):
        _rounds(2, ValueError("bug"))
    assert [r.exc_info is not None for r in caplog.records] == [True, True]
