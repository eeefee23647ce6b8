"""Coalesced writes: batching under load, one result (or exception) per item."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from aigcq.asynch.coalesce import Coalescer


async def test_items_arriving_while_a_batch_runs_go_out_together() -> None:
    batches: list[list[int]] = []

    async def flush(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        await asyncio.sleep(0.01)  # time: a batch takes a while; the next items queue
        return [i * 10 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(flush, max_batch=3)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(8)))
    assert results == [i * 10 for i in range(8)]
    assert batches == [[0], [1, 2, 3], [4, 5, 6], [7]]  # a lone item is not held back


async def test_exceptions_reach_their_own_callers() -> None:
    async def flush(items: Sequence[int]) -> list[int | Exception]:
        if 99 in items:
            raise RuntimeError("batch failed")
        return [ValueError(i) if i % 2 else i for i in items]

    coalescer: Coalescer[int, int] = Coalescer(flush)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(4)), return_exceptions=True)
    assert results[0] == 0 and results[2] == 2
    assert isinstance(results[1], ValueError) and isinstance(results[3], ValueError)
    with pytest.raises(RuntimeError, match="batch failed"):
        await coalescer.submit(99)
    assert await coalescer.submit(4) == 4  # still working afterwards
