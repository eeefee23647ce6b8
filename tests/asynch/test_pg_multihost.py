"""asynch's PostgreSQL behind a libpq multi-host URL with ``target_session_attrs=read-write``
(docs/topologies.md): its pool connects to the writable server of the list, and after a
failover (the primary turned read-only, its sessions ended; the standby writable) its next
connections go to the new primary with no restart. Two real servers; "standby" is a
server whose sessions default to read-only, which is what libpq's check reads."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from aigcq.asynch.db import open_pool
from aigcq.embedded.postgres import PORT, EmbeddedPostgres
from tests.fakes.waiting import wait_until


@pytest.fixture
def second_pg() -> Iterator[EmbeddedPostgres]:
    # Under /tmp, as the session's: when tests run as root, PostgreSQL runs as another user
    data_dir = Path(tempfile.mkdtemp(prefix="aigcq-test-pg-b-"))
    server = EmbeddedPostgres(data_dir, fast=True)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def _set_read_only(server: EmbeddedPostgres, on: bool) -> None:
    """Every new session of ``server`` read-only (a standby, to libpq) or not; with
    ``on``, its current sessions ended (what a demoted primary does to its clients)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        if on:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
        conn.execute("SELECT pg_reload_conf()")
        if on:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )


def _rows(server: EmbeddedPostgres) -> list[Any]:
    with psycopg.connect(server.url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT tag FROM ha_probe ORDER BY tag")]


async def test_the_pool_follows_the_writable_server_of_a_multi_host_url(
    pg_server: EmbeddedPostgres, second_pg: EmbeddedPostgres
) -> None:
    a, b = pg_server, second_pg
    for server in (a, b):
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS ha_probe (tag text)")
            conn.execute("TRUNCATE ha_probe")
    hosts = ",".join(quote(str(s.data_dir)) for s in (a, b))
    url = (
        f"postgresql://postgres@/postgres?host={hosts}&port={PORT},{PORT}"
        "&target_session_attrs=read-write"
    )
    pool = None
    try:
        _set_read_only(a, True)  # a is the standby, b the primary
        pool = await open_pool(url, 4)

        async def write(tag: str) -> bool:
            """False when the connection the pool gave was one the failover ended."""
            assert pool is not None
            try:
                async with pool.connection() as conn:
                    await conn.execute("INSERT INTO ha_probe VALUES (%s)", (tag,))
            except psycopg.Error:
                return False
            return True

        assert await write("before")
        # the failover: b is demoted (its sessions end), a promoted
        _set_read_only(a, False)
        _set_read_only(b, True)
        await wait_until(lambda: write("after"), 20, 0.1, what="a write after the failover")
        assert _rows(b) == ["before"] and _rows(a) == ["after"]
    finally:
        if pool is not None:
            await pool.close()
        with contextlib.suppress(psycopg.Error):
            _set_read_only(a, False)  # the session's server, as the other tests expect
            with psycopg.connect(a.url, autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS ha_probe")
