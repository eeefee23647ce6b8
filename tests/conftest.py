"""Shared fixtures: a private Redis server per test session, flushed per test; aigcq's
default ports held for the session (``tests/fakes/default_ports.py``)."""

from __future__ import annotations

import os
import socket

# pytest-xdist's workers start with COLUMNS=80, which rich reads once, when the CLI's console
# is made at import; the CLI tests give each call its own width (CliRunner env).
os.environ.pop("COLUMNS", None)

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from aigcq.embedded.redis import EmbeddedRedis
from tests.fakes.default_ports import default_ports, hold

_HELD: list[socket.socket] = []


def pytest_configure(config: pytest.Config) -> None:
    """Hold the default ports, as a running ``aigcq up`` holds 8087 and 8089."""
    _HELD.extend(hold(default_ports()))


def pytest_unconfigure(config: pytest.Config) -> None:
    while _HELD:
        _HELD.pop().close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of the test's own, with persistence, that the test may kill and restart."""
    server = EmbeddedRedis(tmp_path / "redis", persist=True)
    server.start()
    yield server
    server.stop()
