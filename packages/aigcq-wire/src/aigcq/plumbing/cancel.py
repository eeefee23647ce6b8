"""Stopping asyncio tasks for sure.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same
loop turn as the result it waits for (fixed in 3.12, CPython gh-86296). redis-py uses it
for every write when a socket timeout is set (its default is 5 s), and several loops use
it around an event, so one ``task.cancel()`` can be lost: the task goes on with its
loop, and ``await task`` after it never returns. :func:`cancel_and_wait` cancels again
until the tasks have ended.

It imports nothing but asyncio: the client SDK uses it, and needs no Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

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
