"""Versioned schema: ``migrations/NNNN_name.sql`` applied in order, each once.

Applied versions are recorded in ``asynch_schema_migrations``. An advisory lock serialises
concurrent start-ups; each migration runs in its own transaction with its version row.

A database created by the Go service (the seed's ``update.sql`` applied by hand: the tables
exist, no migration is recorded) is adopted: its tables are checked against
``0001_initial.sql`` (every column, and the unique keys the service relies on, which are
added when missing), version 1 is recorded as adopted, and the later migrations (written to
be idempotent) are applied as usual. A table that lacks a column stops the migration with a
:class:`SchemaMismatch` naming what is missing; nothing is changed then.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import cast

import psycopg

log = logging.getLogger(__name__)

LOCK_ID = 0x617379_6E6368  # "asynch"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """The migrations shipped in the package, by version."""
    found = []
    for entry in resources.files("aigcq.asynch").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


async def migrate(conninfo: str) -> list[int]:
    """Apply every pending migration; returns the versions applied now."""
    applied_now: list[int] = []
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_ID,))
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS asynch_schema_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM asynch_schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            if not done and await _adopt(conn):
                done.add(1)
            for migration in available():
                if migration.version not in done:
                    await _apply(conn, migration)
                    applied_now.append(migration.version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_ID,))
    return applied_now


class SchemaMismatch(RuntimeError):
    """An existing schema (e.g. the Go service's) lacks what aigcq needs."""


#: What ``0001_initial.sql`` creates and the service relies on.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "asynch_models": (
        "id", "model_name", "models_type", "form", "base_url", "route", "http_method",
        "head_msg", "enabled", "max_concurrency", "queue_limit", "timeout_seconds",
        "expected_seconds", "retry_times", "retry_queue_max_seconds", "auto_clean_seconds",
        "remark", "created_at", "updated_at",
    ),
    "asynch_models_type": (
        "type_id", "type", "prompt_info", "response_json_schema", "version", "remark",
        "created_at", "updated_at",
    ),
    "asynch_task": (
        "id", "task_id", "model_name", "tenant_id", "creator", "biz_name", "callback_url",
        "model_key", "request_payload", "auth_header", "user_info", "state", "retry_count",
        "enqueue_at", "started_at", "finished_at", "expire_at", "oss_file", "file_type",
        "text", "error", "created_at", "updated_at",
    ),
    "asynch_model_stat": (
        "id", "day", "tenant_id", "creator", "model_name", "request_count", "created_at",
        "updated_at",
    ),
}  # fmt: skip
UNIQUE_KEYS: dict[str, tuple[str, ...]] = {
    "asynch_models": ("model_name",),
    "asynch_task": ("task_id",),
    "asynch_model_stat": ("day", "tenant_id", "creator", "model_name"),
}
_COLUMNS = """
SELECT table_name, column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = ANY(%s)
"""
_UNIQUE = """
SELECT array_agg(a.attname::text ORDER BY a.attname) AS cols
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indpred IS NULL
GROUP BY i.indexrelid
"""


async def _adopt(conn: psycopg.AsyncConnection[object]) -> bool:
    """Adopt tables created without aigcq (no migration recorded); False when there are none."""
    cur = await conn.execute(_COLUMNS, (list(REQUIRED_COLUMNS),))
    found: dict[str, set[str]] = {}
    for row in await cur.fetchall():
        name, column_name = cast("tuple[str, str]", row)
        found.setdefault(name, set()).add(column_name)
    if not found:
        return False
    missing = [
        f"{table}.{column}" if table in found else table
        for table, columns in REQUIRED_COLUMNS.items()
        for column in (columns if table in found else columns[:1])
        if table not in found or column not in found[table]
    ]
    if missing:
        raise SchemaMismatch(
            "the existing asynch tables cannot be adopted; missing: " + ", ".join(missing)
        )
    async with conn.transaction():
        for table, columns in UNIQUE_KEYS.items():
            cur = await conn.execute(_UNIQUE, (table,))
            keys = [sorted(cast("tuple[list[str]]", r)[0]) for r in await cur.fetchall()]
            if sorted(columns) not in keys:
                name = f"{table}_{'_'.join(columns)}_key"
                cols = ", ".join(columns)
                await conn.execute(f"CREATE UNIQUE INDEX {name} ON {table} ({cols})".encode())
                log.warning("adopted schema: added the unique key %s (%s)", name, cols)
        await conn.execute(
            "INSERT INTO asynch_schema_migrations (version, name) VALUES (1, 'initial (adopted)')"
        )
    log.info("adopted the existing asynch tables as migration 0001")
    return True


async def _apply(conn: psycopg.AsyncConnection[object], migration: Migration) -> None:
    async with conn.transaction():
        await conn.execute(migration.sql.encode())
        await conn.execute(
            "INSERT INTO asynch_schema_migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )
    log.info("applied migration %04d_%s", migration.version, migration.name)
