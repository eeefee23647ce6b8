"""Background loops: logging a failed round, and stopping them for sure.

A round that fails because Redis is unreachable (restarting, failing over) is expected
operation: one warning line when a loop first meets the outage, again every
``OUTAGE_REPORT_S`` while it lasts, and one line when Redis answers again — not a line per
round (a loop running ten times a second would flood the log), not a traceback. Anything
else is a bug and is logged with its traceback.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same
loop turn as the result it waits for (fixed in 3.12, CPython gh-86296). redis-py uses it
for every write when a socket timeout is set (its default is 5 s), and several loops use
it around an event, so one ``task.cancel()`` can be lost: the task goes on with its
loop, and ``await task`` after it never returns. :func:`cancel_and_wait` cancels again
until the tasks have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any

from redis import exceptions as redis_errors

log = logging.getLogger(__name__)

#: Redis unreachable (restarting, failing over): expected operation, not a bug.
REDIS_OUTAGE = (redis_errors.ConnectionError, redis_errors.TimeoutError)


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


async def every(
    seconds: float, run_once: Callable[[], Awaitable[object]], logger: logging.Logger, what: str
) -> None:
    """Wait ``seconds``, run ``run_once``, and again, until cancelled; a round that fails is
    logged (:func:`one_round`, as ``what``) and the next one runs as planned."""
    while True:
        await asyncio.sleep(seconds)
        with one_round(logger, what):
            await run_once()


_RETRY_S = 0.05  # how long a cancelled task may take before it is cancelled again


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], timeout: float | None = None
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait until they have ended, or ``timeout`` s have passed;
    the tasks still running then. Their errors are logged, never raised."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        wait = _RETRY_S if deadline is None else min(_RETRY_S, deadline - loop.time())
        if wait <= 0:
            break
        done, pending = await asyncio.wait(pending, timeout=wait)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("%r ended with an error", task, exc_info=task.exception())
    return pending


class Spawner:
    """Fire-and-forget coroutines, kept referenced until they finish (asyncio holds only
    weak references to tasks)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def __call__(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def backoff_delay(attempt: int, cap: float) -> float:
    """Seconds before reconnect ``attempt`` (0-based): 1, 2, 4, … capped, times 0.5–1."""
    return min(cap, 2.0 ** min(attempt, 16)) * random.uniform(0.5, 1.0)
