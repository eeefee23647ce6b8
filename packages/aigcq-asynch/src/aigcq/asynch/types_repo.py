"""``asynch_models_type``: CRUD; creates and updates are pushed to prompts-core inside the
database transaction, so a failed sync rolls the local change back."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
from psycopg import sql

from aigcq.asynch.db import Pool, Row
from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.prompts_core import create_prompt

# After a create with an explicit typeId: later automatic ids start past it, and never go
# back to ids handed out before (deleted types stay known to prompts-core).
_ADVANCE_IDENTITY = """
SELECT setval(s.seq, GREATEST(max(t.type_id), COALESCE(pg_sequence_last_value(s.seq), 1)))
FROM asynch_models_type t,
     CAST(pg_get_serial_sequence('asynch_models_type', 'type_id') AS regclass) AS s(seq)
GROUP BY s.seq
"""


class ModelTypeRepo:
    def __init__(self, pool: Pool, client: httpx.AsyncClient, prompts_core_url: str) -> None:
        self.pool = pool
        self.client = client
        self.prompts_core_url = prompts_core_url

    async def create(self, cols: dict[str, Any]) -> Row:
        query = sql.SQL("INSERT INTO asynch_models_type ({}) VALUES ({}) RETURNING *").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
        )
        explicit_id = "type_id" in cols
        return await self._write_and_sync(query, list(cols.values()), None, explicit_id)

    async def update(self, type_id: int, cols: dict[str, Any]) -> Row:
        assignments: list[sql.Composable] = [
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols
        ]
        assignments.append(sql.SQL("updated_at = now()"))
        query = sql.SQL("UPDATE asynch_models_type SET {} WHERE type_id = %s RETURNING *").format(
            sql.SQL(", ").join(assignments)
        )
        return await self._write_and_sync(query, [*cols.values(), type_id], type_id)

    async def delete(self, type_id: int) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM asynch_models_type WHERE type_id = %s", (type_id,)
            )
            if cur.rowcount == 0:
                raise _not_found(type_id)

    async def get(self, type_id: int) -> Row:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM asynch_models_type WHERE type_id = %s", (type_id,)
            )
            row = await cur.fetchone()
        if row is None:
            raise _not_found(type_id)
        return row

    async def list_types(self, offset: int, limit: int) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM asynch_models_type ORDER BY type_id OFFSET %s LIMIT %s",
                (offset, limit),
            )
            return await cur.fetchall()

    async def _write_and_sync(
        self,
        query: sql.Composed,
        params: list[Any],
        type_id: int | None,
        advance_identity: bool = False,
    ) -> Row:
        try:
            async with self.pool.connection() as conn, conn.transaction():
                row = await (await conn.execute(query, params)).fetchone()
                if row is None:
                    raise _not_found(type_id or 0)
                if advance_identity:
                    await conn.execute(_ADVANCE_IDENTITY)
                await create_prompt(self.client, self.prompts_core_url, row)
        except psycopg.errors.UniqueViolation:
            raise AsynchError(
                Code.MODEL_TYPE_EXISTS, "a model type with that id or type exists"
            ) from None
        return row


def _not_found(type_id: int) -> AsynchError:
    return AsynchError(Code.MODEL_TYPE_NOT_FOUND, f"model type {type_id} does not exist")
