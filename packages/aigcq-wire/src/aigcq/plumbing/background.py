"""Background loops: logging a failed round, spawning, backing off. Stopping them for sure
is :mod:`aigcq.plumbing.cancel`'s.

A round that fails because Redis is unreachable (restarting, failing over) is expected
operation: one warning line when a loop first meets the outage, again every
``OUTAGE_REPORT_S`` while it lasts, and one line when Redis answers again — not a line per
round (a loop running ten times a second would flood the log), not a traceback. Anything
else is a bug and is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

log = logging.getLogger(__name__)


def _redis_outage() -> tuple[type[Exception], ...]:
    """redis's connection and timeout errors; none where redis is not installed (the bridge
    and the SDK ship without it, so nothing they run can meet a Redis outage)."""
    try:
        from redis import exceptions as redis_errors
    except ImportError:
        return ()
    return (redis_errors.ConnectionError, redis_errors.TimeoutError)


#: Redis unreachable (restarting, failing over): expected operation, not a bug.
REDIS_OUTAGE = _redis_outage()


#: how often a Redis outage that lasts is reported again, per loop
OUTAGE_REPORT_S = 30.0
#: loop (its ``what``) -> when its current Redis outage was last reported (monotonic)
_outages: dict[str, float] = {}


def round_failed(logger: logging.Logger, what: str, exc: Exception) -> None:
    """Log a failed round of a background loop (call it from ``except Exception``)."""
    if not isinstance(exc, REDIS_OUTAGE):
        logger.exception("%s", what)
        return
    now, last = time.monotonic(), _outages.get(what)
    if last is None or now - last >= OUTAGE_REPORT_S:
        _outages[what] = now
        still = "" if last is None else " (still)"
        logger.warning("%s: Redis unavailable%s (%s); trying again", what, still, exc)


def round_ok(logger: logging.Logger, what: str) -> None:
    """A round of the loop ``what`` succeeded: say so once if Redis had been away."""
    if _outages.pop(what, None) is not None:
        logger.warning("%s: Redis reachable again", what)


@contextlib.contextmanager
def one_round(logger: logging.Logger, what: str) -> Iterator[None]:
    """One round of a background loop: its failure is logged (:func:`round_failed`) and
    the loop goes on; its success after a Redis outage says so (:func:`round_ok`)."""
    try:
        yield
    except Exception as exc:
        round_failed(logger, what, exc)
    else:
        round_ok(logger, what)


async def nudged(
    seconds: float,
    nudge: asyncio.Event,
    run_once: Callable[[], Awaitable[object]],
    logger: logging.Logger,
    what: str,
) -> None:
    """Run ``run_once`` now, then again once ``nudge`` is set or ``seconds`` passed, until
    cancelled; a round that fails is logged (:func:`one_round`, as ``what``)."""
    while True:
        nudge.clear()
        with one_round(logger, what):  # failed: keep the last view, try again
            await run_once()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(nudge.wait(), seconds)


async def every(
    seconds: float, run_once: Callable[[], Awaitable[object]], logger: logging.Logger, what: str
) -> None:
    """Wait ``seconds``, run ``run_once``, and again, until cancelled; a round that fails is
    logged (:func:`one_round`, as ``what``) and the next one runs as planned."""
    while True:
        await asyncio.sleep(seconds)
        with one_round(logger, what):
            await run_once()


class Spawner:
    """Fire-and-forget coroutines, kept referenced until they finish (asyncio holds only
    weak references to tasks)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def __call__(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


def backoff_delay(attempt: int, cap: float) -> float:
    """Seconds before reconnect ``attempt`` (0-based): 1, 2, 4, … capped, times 0.5–1."""
    return min(cap, 2.0 ** min(attempt, 16)) * random.uniform(0.5, 1.0)
