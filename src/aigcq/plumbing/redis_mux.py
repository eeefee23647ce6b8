"""One pipelined Redis connection for the hot path: every command of a server process's
task steps goes through it, in order, without waiting for earlier replies.

redis-py's asyncio client costs about 150 µs of CPU per round trip on top of the socket
work (pool checkout, pipeline object, retry and timeout wrappers, per-reply callbacks);
at a few round trips per task that was a third of a server's CPU when tasks arrive one
by one. This connection writes each batch with one ``write`` and hands replies to
waiting futures as hiredis (redis-py's own C parser) decodes them. It reuses redis-py's
parsing of the URL (address, unix socket, TLS context, credentials, database) and its
exception classes; everything else in the process still uses redis-py.

Replies are raw RESP2, with no redis-py response callbacks (``XRANGE`` entries are
``[id, [field, value, ...]]``). A lost connection fails the commands in flight with
``ConnectionError``, a Redis silent for ``socket_timeout`` (redis-py's, 5 s by default)
with ``TimeoutError``; the connection is made again on the next command, and commands
made meanwhile wait for it in one queue, so they still run in the order made. Nothing is
retried here, because a script may already have run.

Each connection is made to the current master: for a Sentinel client (a ``redis+sentinel://``
URL) its address is asked of the sentinels each time, and for a host name it is looked up
again (a managed Redis's failover DNS name). A ``READONLY`` reply means the server was
demoted: that command failed unrun, and the connection is dropped, so the next command
reconnects to the new master.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ConnectionError,
    DataError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

Command = Sequence[Any]


class _Protocol(asyncio.Protocol):
    def __init__(self, encoding: str | None, errors: str, timeout_s: float | None) -> None:
        """``timeout_s``: how long replies may be awaited with no reply coming in before
        the connection is dropped (redis-py's ``socket_timeout``; None: forever)."""
        kw: dict[str, Any] = {"encoding": encoding, "errors": errors} if encoding else {}
        self.reader = hiredis.Reader(replyError=ResponseError, **kw)
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.timeout_s = timeout_s
        self._timed_out = False
        self._demoted = False  # a READONLY reply came: this server is a replica now
        self._heard = 0.0  # loop time of the last reply, or of the first one awaited
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _watch(self) -> None:
        """Drop the connection when replies are awaited and none came for ``timeout_s``
        (a Redis that hangs would otherwise hold its callers forever)."""
        self._watchdog = None
        if not self.waiters or self.timeout_s is None or self.transport is None:
            return
        loop = asyncio.get_running_loop()
        silent = loop.time() - self._heard
        if silent >= self.timeout_s:
            self._timed_out = True
            self.transport.abort()
            return
        self._watchdog = loop.call_later(self.timeout_s - silent, self._watch)

    def data_received(self, data: bytes) -> None:
        self._heard = asyncio.get_running_loop().time()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            fut = self.waiters.popleft()
            if fut.done():  # its caller was cancelled
                continue
            if isinstance(reply, ResponseError):
                error = _error(reply)
                self._demoted |= isinstance(error, ReadOnlyError)
                fut.set_exception(error)
            else:
                fut.set_result(reply)
        if self._demoted and self.transport is not None:
            self.transport.abort()  # the commands still in flight fail: reconnect to the master

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.transport = None
        kind = RedisTimeoutError if self._timed_out else ConnectionError
        why = f"no reply in {self.timeout_s} s" if self._timed_out else exc or "closed by Redis"
        if self._demoted:
            why = "the server is a replica now (READONLY)"
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():  # one exception each: a raised one collects its traceback
                fut.set_exception(kind(f"Redis connection lost: {why}"))

    def send(self, commands: Sequence[Command], replies: list[asyncio.Future[Any]]) -> None:
        """Write every command that packs; one that does not (an argument of a type
        Redis has no encoding for, such as None) fails alone, unsent."""
        assert self.transport is not None
        packed = []
        for command, fut in zip(commands, replies, strict=True):
            try:
                packed.append(hiredis.pack_command(tuple(command)))
            except TypeError as exc:
                fut.set_exception(DataError(f"{command[0]}: {exc}"))
                continue
            if not self.waiters:
                self._heard = asyncio.get_running_loop().time()
            self.waiters.append(fut)
        if self.timeout_s is not None and self._watchdog is None and self.waiters:
            self._watchdog = asyncio.get_running_loop().call_later(self.timeout_s, self._watch)
        self.transport.write(b"".join(packed))


def _error(reply: ResponseError) -> RedisError:
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith("READONLY"):
        return ReadOnlyError(message)
    return reply


class RedisMux:
    """Commands made in one event-loop turn leave together in one write, on one
    connection made like ``redis``'s own connections; replies come back in order."""

    def __init__(self, redis: Redis) -> None:
        """``redis``: where the connection settings come from, and the client that
        (re)loads scripts after a Redis restart."""
        self._pool = redis.connection_pool
        self._template = self._pool.make_connection()  # type: ignore[no-untyped-call]
        self._proto: _Protocol | None = None
        self._batch: list[tuple[Command, asyncio.Future[Any]]] = []
        #: batches waiting for a connection, oldest first: a later batch never overtakes them
        self._waiting: list[tuple[list[Command], list[asyncio.Future[Any]]]] = []
        self._connector: asyncio.Task[None] | None = None

    async def command(self, *args: Any) -> Any:
        """One command; its raw RESP2 reply."""
        return await self._enqueue(args)

    async def commands(self, *commands: Command) -> list[Any]:
        """Several commands in one write; their replies, in order (the first error is
        raised, once every reply is in)."""
        replies = await asyncio.gather(*map(self._enqueue, commands), return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def replicas(self, n: int, timeout_ms: int) -> int:
        """How many replicas have every write this connection made before the call (at
        least ``n``, or as many as did within ``timeout_ms``): Redis's ``WAIT``. Callers in
        one event-loop turn share one WAIT, sent behind their writes. WAIT holds this
        connection's later commands in Redis until it answers, so keep ``timeout_ms`` short."""
        batch = self._batch
        if batch and batch[-1][0] == ("WAIT", n, timeout_ms):
            shared = batch[-1][1]
        else:
            shared = self._enqueue(("WAIT", n, timeout_ms))
        return int(await asyncio.shield(shared))

    async def script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run a registered Lua script (loaded through redis-py when Redis lost it)."""
        try:
            return await self._enqueue(("EVALSHA", script.sha, len(keys), *keys, *args))
        except NoScriptError:  # Redis restarted since
            return await script(keys=keys, args=args)

    def _enqueue(self, command: Command) -> asyncio.Future[Any]:
        """Queue ``command`` for the write at the end of this event-loop turn."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._batch.append((command, fut))
        if len(self._batch) == 1:
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        commands = [command for command, _ in batch]
        replies = [fut for _, fut in batch]
        if not self._waiting and self._send(commands, replies):
            return
        self._waiting.append((commands, replies))  # behind every batch still waiting
        if self._connector is None or self._connector.done():
            self._connector = asyncio.ensure_future(self._connect_and_send())

    @property
    def connected(self) -> bool:
        proto = self._proto
        return (
            proto is not None and proto.transport is not None and not proto.transport.is_closing()
        )

    def _send(self, commands: Sequence[Command], replies: list[asyncio.Future[Any]]) -> bool:
        """Write ``commands`` now; each reply (or error) goes to its future in ``replies``.
        False: not connected, nothing written."""
        if not self.connected:
            return False
        assert self._proto is not None
        self._proto.send(commands, replies)
        return True

    async def _connect_and_send(self) -> None:
        """Connect, then write every waiting batch in the order made, in one go (no later
        batch can slip in between); a failed connection fails them all."""
        try:
            if not self.connected:
                self._proto = await self._connect()
        except BaseException as exc:
            error = exc if isinstance(exc, RedisError) else ConnectionError(repr(exc))
            self._fail_waiting(error)
            if not isinstance(exc, Exception):
                raise
            return
        waiting, self._waiting = self._waiting, []
        for commands, replies in waiting:
            if not self._send(commands, replies):  # lost again at once
                _fail(replies, ConnectionError("Redis connection lost while connecting"))

    def _fail_waiting(self, error: RedisError) -> None:
        waiting, self._waiting = self._waiting, []
        for _, replies in waiting:
            _fail(replies, error)

    async def _connect(self) -> _Protocol:
        t = self._template
        encoder = t.encoder
        decode = encoder.encoding if encoder.decode_responses else None
        loop = asyncio.get_running_loop()

        def factory() -> _Protocol:
            return _Protocol(decode, encoder.encoding_errors, t.socket_timeout)

        try:
            async with asyncio.timeout(t.socket_connect_timeout):
                if isinstance(t, UnixDomainSocketConnection):
                    _, proto = await loop.create_unix_connection(factory, t.path)
                else:
                    host, port = await self._address()
                    ssl = t.ssl_context.get() if hasattr(t, "ssl_context") else None
                    _, proto = await loop.create_connection(
                        factory, host, port, ssl=ssl, server_hostname=host if ssl else None
                    )
                    _keepalive(proto)
                await self._handshake(proto)
        except TimeoutError as exc:  # from asyncio.timeout
            raise RedisTimeoutError(
                f"Redis did not answer within {t.socket_connect_timeout} s"
            ) from exc
        except OSError as exc:
            raise ConnectionError(f"cannot connect to Redis: {exc}") from exc
        return proto

    async def _address(self) -> tuple[str, int]:
        """The master's address: the sentinels' answer now, or the URL's host."""
        if isinstance(self._pool, SentinelConnectionPool):
            host, port = await self._pool.get_master_address()  # type: ignore[no-untyped-call]
            return str(host), int(port)
        return self._template.host, self._template.port

    async def _handshake(self, proto: _Protocol) -> None:
        t = self._template
        commands: list[Command] = []
        if t.credential_provider is not None:
            creds = await t.credential_provider.get_credentials_async()
            commands.append(("AUTH", *creds))
        elif t.password:
            commands.append(
                ("AUTH", t.username, t.password) if t.username else ("AUTH", t.password)
            )
        if t.db:
            commands.append(("SELECT", t.db))
        commands.append(("CLIENT", "SETNAME", t.client_name or "aigcq-hot-path"))
        replies = [asyncio.get_running_loop().create_future() for _ in commands]
        proto.send(commands, replies)
        try:
            for fut in replies:
                await fut
        except BaseException:
            if proto.transport is not None:
                proto.transport.close()
            raise

    async def aclose(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()


def _fail(replies: list[asyncio.Future[Any]], error: RedisError) -> None:
    for fut in replies:
        if not fut.done():  # one exception each: a raised one collects its traceback
            fut.set_exception(type(error)(*error.args))


def _keepalive(proto: _Protocol) -> None:
    assert proto.transport is not None
    sock = proto.transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
