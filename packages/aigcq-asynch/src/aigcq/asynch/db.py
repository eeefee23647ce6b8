"""The PostgreSQL connection pool: autocommit connections returning rows as dicts."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
Row = dict[str, Any]


async def open_pool(conninfo: str, max_size: int, timeout: float = 30.0) -> Pool:
    """``timeout``: the longest wait for a connection (PoolTimeout after it)."""
    pool: Pool = AsyncConnectionPool(
        conninfo,
        timeout=timeout,
        min_size=min(2, max_size),
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 2},
        connection_class=AsyncConnection[DictRow],
        open=False,
    )
    await pool.open(wait=True, timeout=30)
    return pool
