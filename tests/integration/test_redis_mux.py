"""The hot-path Redis connection (``aigcq.plumbing.redis_mux``) against real Redis servers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aigcq.embedded.redis import EmbeddedRedis, find_redis_server
from aigcq.plumbing.redis_client import redis_client
from aigcq.plumbing.redis_mux import RedisMux
from tests.fakes.processes import reserved_port
from tests.fakes.servers import closed_port
from tests.fakes.waiting import until, wait_until


async def run(mux: RedisMux, *commands: list[Any]) -> list[Any]:
    """``commands`` made in one event-loop turn (one write); replies or exceptions."""
    return list(await asyncio.gather(*(mux.command(*c) for c in commands), return_exceptions=True))


async def test_replies_come_back_in_order_with_errors_in_place(redis: aioredis.Redis) -> None:
    mux = RedisMux(redis)
    try:
        replies = await run(
            mux,
            ["SET", "k", "v"],
            ["INCR", "k"],  # wrong type: an error in its own place, the rest unaffected
            ["EVALSHA", "0" * 40, 0],
            ["RPUSH", "l", "a", "b"],
            ["GET", "k"],
        )
        assert replies[0] == "OK"
        assert isinstance(replies[1], ResponseError)
        assert isinstance(replies[2], NoScriptError)
        assert replies[3:] == [2, "v"]
        bad, good = await run(mux, ["SET", "k", None], ["GET", "k"])  # None: no encoding
        assert isinstance(bad, DataError) and good == "v"
        with pytest.raises(ResponseError):  # ``commands`` raises the first error...
            await mux.commands(["INCR", "k"], ["SET", "k2", "w"])
        assert await redis.get("k2") == "w"  # ...after every command has run
    finally:
        await mux.aclose()


async def test_a_cancelled_caller_does_not_shift_the_replies(redis: aioredis.Redis) -> None:
    mux = RedisMux(redis)
    try:
        calls = [asyncio.ensure_future(mux.command("ECHO", x)) for x in "abc"]
        await asyncio.sleep(0)  # a loop turn: all three queued for one write
        calls[1].cancel()
        assert await calls[0] == "a"
        assert await calls[2] == "c"
        assert await mux.command("ECHO", "d") == "d"
    finally:
        await mux.aclose()


async def test_a_script_redis_forgot_is_loaded_again(redis: aioredis.Redis) -> None:
    mux = RedisMux(redis)
    script = redis.register_script("return {KEYS[1], ARGV[1]}")
    try:
        assert await mux.script(script, ["k"], ["v"]) == ["k", "v"]  # never loaded before
        await redis.script_flush()  # as after a restart
        assert await mux.script(script, ["k2"], ["v2"]) == ["k2", "v2"]
    finally:
        await mux.aclose()


async def test_commands_fail_while_redis_is_down_and_work_once_it_is_back(
    private_redis: EmbeddedRedis,
) -> None:
    client = redis_client(private_redis.url)
    mux = RedisMux(client)
    try:
        assert await run(mux, ["SET", "k", "1"]) == ["OK"]
        private_redis.kill()

        await wait_until(lambda: not mux.connected, 15)  # noticed without a command sent
        (error,) = await run(mux, ["GET", "k"])
        assert isinstance(error, ConnectionError)
        private_redis.start()
        got = await until(partial(run, mux, ["GET", "k"]), lambda r: r == ["1"], within=15)
        assert got == ["1"]  # reconnected, the data kept
    finally:
        await mux.aclose()
        await client.aclose()


async def test_a_redis_that_hangs_fails_the_commands_after_the_socket_timeout(
    private_redis: EmbeddedRedis,
) -> None:
    client = redis_client(f"{private_redis.url}?socket_timeout=0.5")
    mux = RedisMux(client)
    pid = private_redis._proc.pid  # type: ignore[union-attr]
    try:
        assert await mux.command("SET", "k", "1") == "OK"
        os.kill(pid, signal.SIGSTOP)  # alive, connected, silent
        try:
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                await mux.command("GET", "k")
            assert time.monotonic() - started < 5.0  # about the 0.5 s, not forever
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await mux.command("GET", "k") == "1"  # a new connection
    finally:
        await mux.aclose()
        await client.aclose()


@pytest.fixture
def tcp_redis_with_password(tmp_path: Path) -> Iterator[int]:
    port = reserved_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--requirepass", "s3cret"]
    proc = subprocess.Popen(
        [find_redis_server(), *args, "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    yield port
    proc.kill()
    proc.wait()


async def test_tcp_with_a_password_and_a_database(tcp_redis_with_password: int) -> None:
    url = f"redis://:s3cret@127.0.0.1:{tcp_redis_with_password}/3"
    client = redis_client(url)
    await until_ping(client)
    mux = RedisMux(client)
    try:
        assert await run(mux, ["SET", "k", "in-3"]) == ["OK"]
        assert await client.get("k") == "in-3"  # the same database as redis-py's
        db0 = redis_client(url.removesuffix("/3") + "/0")
        assert await db0.get("k") is None
        await db0.aclose()
        wrong = RedisMux(redis_client(url.replace("s3cret", "wrong")))
        (error,) = await run(wrong, ["PING"])
        assert isinstance(error, ResponseError) and "WRONGPASS" in str(error)
        await wrong.aclose()
    finally:
        await mux.aclose()
        await client.aclose()


async def until_ping(client: aioredis.Redis) -> None:
    await wait_until(client.ping, 5.0, 0.05, ignore=(ConnectionError,), what="redis-server up")


async def test_nothing_listening_is_a_connection_error() -> None:
    with closed_port() as port:
        mux = RedisMux(redis_client(f"redis://127.0.0.1:{port}/0"))
        (error,) = await run(mux, ["PING"])
    assert isinstance(error, ConnectionError)


async def test_calls_keep_the_order_they_were_made_in_across_a_reconnect(
    redis: aioredis.Redis,
) -> None:
    """Issue 15 item 10: calls made while the connection is made again leave in order
    (each waited on its own, and a later one could overtake an earlier one)."""
    mux = RedisMux(redis)
    try:
        own_id = await mux.command("CLIENT", "ID")
        await redis.client_kill_filter(_id=own_id)

        await wait_until(lambda: not mux.connected)
        calls = []
        for i in range(300):  # one call per event-loop turn, during and after the reconnect
            calls.append(asyncio.ensure_future(mux.command("RPUSH", "order", i)))
            await asyncio.sleep(0)  # a loop turn per call: the subject
        await asyncio.gather(*calls)
        assert [int(x) for x in await redis.lrange("order", 0, -1)] == list(range(300))
    finally:
        await mux.aclose()
