"""cancel_and_wait: background tasks end even when a cancellation is lost; every: a loop
that outlives its failed rounds."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from aigcq.plumbing.background import every
from aigcq.plumbing.cancel import cancel_and_wait


async def test_a_task_that_loses_cancellations_is_cancelled_again() -> None:
    lost = 0
    started = asyncio.Event()

    async def loop() -> None:  # as a loop whose wait_for swallowed the cancellation
        nonlocal lost
        started.set()
        while True:
            try:
                await asyncio.sleep(10)  # blocked until cancelled: the subject
            except asyncio.CancelledError:
                if lost == 2:
                    raise
                lost += 1

    task = asyncio.create_task(loop())
    await started.wait()
    assert await cancel_and_wait([task], timeout=5.0) == set()
    assert task.cancelled() and lost == 2


async def test_a_task_that_never_ends_is_handed_back_after_the_timeout() -> None:
    stop, started = asyncio.Event(), asyncio.Event()

    async def deaf() -> None:
        started.set()
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)  # blocked, deaf to cancellation: the subject

    task = asyncio.create_task(deaf())
    await started.wait()
    assert await cancel_and_wait([task], timeout=0.2) == {task}
    stop.set()
    await cancel_and_wait([task])
    assert task.done()


async def test_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()

    async def broken() -> None:
        started.set()
        try:
            await asyncio.sleep(10)  # blocked until cancelled: the subject
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(broken())
    await started.wait()
    with caplog.at_level(logging.WARNING, logger="aigcq.plumbing.cancel"):
        # beside it a task that ends at once (a sleep of 0 s)
        assert await cancel_and_wait([task, asyncio.create_task(asyncio.sleep(0))]) == set()
    assert "cleanup failed" in caplog.text


async def test_a_failed_round_is_logged_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rounds = 0
    third = asyncio.Event()

    async def one_round() -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 3:
            third.set()
        if rounds == 1:
            raise RuntimeError("first round broke")

    with caplog.at_level(logging.ERROR, logger="test.every"):
        loop = asyncio.create_task(every(0, one_round, logging.getLogger("test.every"), "pass"))
        await third.wait()
        await cancel_and_wait([loop])
    assert "first round broke" in caplog.text and rounds >= 3
