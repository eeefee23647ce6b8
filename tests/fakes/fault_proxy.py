"""A TCP proxy in front of a Redis (or any) server that can lose replies on purpose.

``lose_replies_after(marker)``: the first request whose bytes contain ``marker`` reaches
the server (so it runs), but from then on nothing comes back on that connection: a reply
lost on the way, as after a network fault. Other connections are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class FaultProxy:
    def __init__(self, upstream_url: str) -> None:
        self.upstream = urlsplit(upstream_url)
        self.marker: bytes | None = None
        self.lost = asyncio.Event()  # set once a request's reply has been lost
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def lose_replies_after(self, marker: bytes) -> None:
        self.marker = marker

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}"

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream.scheme == "unix":
            return await asyncio.open_unix_connection(self.upstream.path)
        return await asyncio.open_connection(self.upstream.hostname, self.upstream.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._open_upstream()
        silent = asyncio.Event()

        async def requests() -> None:
            while data := await reader.read(1 << 16):
                if self.marker is not None and self.marker in data and not silent.is_set():
                    self.marker = None
                    silent.set()
                up_writer.write(data)
                await up_writer.drain()

        async def replies() -> None:
            while data := await up_reader.read(1 << 16):
                if silent.is_set():
                    self.lost.set()
                    continue
                writer.write(data)
                await writer.drain()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(requests(), replies())
        for w in (writer, up_writer):
            w.close()

    def _spawn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def fault_proxy(upstream_url: str) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(upstream_url)
    proxy._server = await asyncio.start_server(proxy._spawn, "127.0.0.1", 0)
    try:
        yield proxy
    finally:
        proxy._server.close()
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
