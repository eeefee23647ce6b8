"""``asynch_models``: CRUD, and a short per-process cache of configs for the hot path."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, fields
from typing import Any

import psycopg
from psycopg import sql

from aigcq.asynch.db import Pool, Row
from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.states import LIVE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelConfig:
    """What the gate, the worker and the cleaner need of a model."""

    model_name: str
    base_url: str
    route: str
    http_method: str
    head_msg: str
    enabled: int
    max_concurrency: int
    queue_limit: int
    timeout_seconds: int
    expected_seconds: int
    retry_times: int
    retry_queue_max_seconds: int
    auto_clean_seconds: int
    models_type: str = ""
    #: The parsed ``responseJsonSchema`` of the model's types that declare one.
    response_schemas: tuple[Any, ...] = ()

    @classmethod
    def from_row(cls, row: Row, response_schemas: tuple[Any, ...] = ()) -> ModelConfig:
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        return cls(**values, response_schemas=response_schemas)

    @property
    def url(self) -> str:
        route = self.route if not self.route or self.route.startswith("/") else f"/{self.route}"
        return self.base_url.rstrip("/") + route


class ModelRepo:
    def __init__(self, pool: Pool, cache_seconds: float) -> None:
        self.pool = pool
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, ModelConfig]] = {}

    async def create(self, name: str, cols: Row) -> Row:
        await self._note_unknown_types(name, cols.get("models_type", ""))
        cols = {"model_name": name, **cols}
        query = sql.SQL("INSERT INTO asynch_models ({}) VALUES ({}) RETURNING *").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
        )
        try:
            row = await self._fetch_one(query, list(cols.values()))
        except psycopg.errors.UniqueViolation:
            raise AsynchError(Code.MODEL_EXISTS, f"model {name!r} already exists") from None
        assert row is not None
        return row

    async def update(self, name: str, cols: Row) -> Row:
        await self._note_unknown_types(name, cols.get("models_type", ""))
        assignments: list[sql.Composable] = [
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols
        ]
        assignments.append(sql.SQL("updated_at = now()"))
        query = sql.SQL("UPDATE asynch_models SET {} WHERE model_name = %s RETURNING *").format(
            sql.SQL(", ").join(assignments)
        )
        row = await self._fetch_one(query, [*cols.values(), name])
        self.forget(name)
        if row is None:
            raise _not_found(name)
        return row

    async def delete(self, name: str) -> None:
        """Delete a model that has no queued or running task."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT 1 FROM asynch_models WHERE model_name = %s FOR UPDATE", (name,)
            )
            if await cur.fetchone() is None:
                raise _not_found(name)
            cur = await conn.execute(
                "SELECT count(*) AS count FROM asynch_task"
                " WHERE model_name = %s AND state = ANY(%s)",
                (name, list(LIVE)),
            )
            live = (await cur.fetchone() or {"count": 0})["count"]
            if live:
                raise AsynchError(Code.MODEL_BUSY, f"model {name!r} has {live} live tasks")
            await conn.execute("DELETE FROM asynch_models WHERE model_name = %s", (name,))
        self.forget(name)

    async def get(self, name: str) -> Row:
        row = await self._fetch_one(
            sql.SQL("SELECT * FROM asynch_models WHERE model_name = %s"), [name]
        )
        if row is None:
            raise _not_found(name)
        return row

    async def list_models(self, enabled: int | None, offset: int, limit: int) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM asynch_models WHERE (%s::int IS NULL OR enabled = %s::int)"
                " ORDER BY id OFFSET %s LIMIT %s",
                (enabled, enabled, offset, limit),
            )
            return await cur.fetchall()

    def forget(self, name: str) -> None:
        """Drop the model's cached config: the next :meth:`config` reads its row."""
        self._cache.pop(name, None)

    async def config(self, name: str) -> ModelConfig:
        """The model's config, cached for ``cache_seconds``."""
        cached = self._cache.get(name)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        row = await self.get(name)
        config = ModelConfig.from_row(row, await self._schemas(row["models_type"]))
        self._cache[name] = (time.monotonic() + self.cache_seconds, config)
        return config

    async def _note_unknown_types(self, name: str, models_type: str) -> None:
        """Log the ids of ``models_type`` the types table lacks. They are kept, as the Go
        service keeps them (seed 003 creates its model with ``"1,2,3"`` first): a type
        created later applies from then on."""
        ids = sorted({int(i) for i in models_type.split(",") if i.strip().isdigit()})
        if not ids:
            return
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT type_id FROM asynch_models_type WHERE type_id = ANY(%s::bigint[])", (ids,)
            )
            known = {r["type_id"] for r in await cur.fetchall()}
        missing = [i for i in ids if i not in known]
        if missing:
            log.warning(
                "model %s: modelsType lists %s, not in asynch_models_type yet (kept; such a"
                " type's responseJsonSchema applies once it is created)",
                name,
                ", ".join(map(str, missing)),
            )

    async def _schemas(self, models_type: str) -> tuple[Any, ...]:
        """The parsed ``responseJsonSchema`` of the listed type ids that have one."""
        ids = [int(i) for i in models_type.split(",") if i.strip().isdigit()]
        if not ids:
            return ()
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT response_json_schema FROM asynch_models_type"
                " WHERE type_id = ANY(%s::bigint[]) AND response_json_schema <> ''"
                " ORDER BY type_id",
                (ids,),
            )
            texts = [r["response_json_schema"] for r in await cur.fetchall()]
        schemas = []
        for text in texts:
            try:
                schemas.append(json.loads(text))
            except json.JSONDecodeError:
                continue  # not a schema we can follow
        return tuple(s for s in schemas if isinstance(s, dict))

    async def _fetch_one(self, query: sql.SQL | sql.Composed, params: list[Any]) -> Row | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchone()


def _not_found(name: str) -> AsynchError:
    return AsynchError(Code.MODEL_NOT_FOUND, f"model {name!r} does not exist")
