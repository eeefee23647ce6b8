"""Coalesce concurrent single-row writes into one statement per batch.

Under load many attempts finish (and many createTask calls insert) within the same moment;
each as its own statement costs a pool checkout and a PostgreSQL round trip, the largest
share of the hot path's CPU. A :class:`Coalescer` queues the items and has at most
``parallel`` batches in flight: a lone item goes out at once (no added latency when idle);
items that arrive meanwhile go out together as soon as a batch slot is free.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

_I = TypeVar("_I")
_R = TypeVar("_R")


class Coalescer(Generic[_I, _R]):
    """``await submit(item)`` runs ``flush`` over a batch holding ``item`` and returns its
    result for that item. ``flush`` returns one result per item, in order (an exception
    instance is raised to that item's caller); when it raises, every item of that batch
    gets the exception."""

    def __init__(
        self,
        flush: Callable[[Sequence[_I]], Awaitable[Sequence[_R | Exception]]],
        *,
        max_batch: int = 200,
        parallel: int = 1,
    ) -> None:
        self._flush = flush
        self.max_batch = max_batch
        self.parallel = parallel
        self._queue: list[tuple[_I, asyncio.Future[_R]]] = []
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, item: _I) -> _R:
        future: asyncio.Future[_R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._kick()
        return await future

    def _kick(self) -> None:
        while self._queue and len(self._running) < self.parallel:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            task = asyncio.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._kick()

    async def _run(self, batch: list[tuple[_I, asyncio.Future[_R]]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
