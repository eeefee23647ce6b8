"""Versioned schema: ``migrations/NNNN_name.sql`` applied in order, each once.

Applied versions are recorded in ``asynch_schema_migrations``. An advisory lock serialises
concurrent start-ups; each migration runs in its own transaction with its version row.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

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
            for migration in available():
                if migration.version not in done:
                    await _apply(conn, migration)
                    applied_now.append(migration.version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_ID,))
    return applied_now


async def _apply(conn: psycopg.AsyncConnection[object], migration: Migration) -> None:
    async with conn.transaction():
        await conn.execute(migration.sql.encode())
        await conn.execute(
            "INSERT INTO asynch_schema_migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )
    log.info("applied migration %04d_%s", migration.version, migration.name)
