"""A load balancer in front of several ``aigcq serve`` processes, for the callback URL.

A platform retries a webhook a few times only (RunningHub about 3), so in a fleet
``AIGCQ_CALLBACK_URL`` names an address that reaches whichever serve is up, not one
process (docs/operations.md). :class:`Front` is that address in a bench run: each
connection it accepts goes to the first backend that takes it, trying them in turn from
the one after the last used; the bytes are copied both ways until either side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools


class Front:
    def __init__(self) -> None:
        self.backends: list[int] = []  # ports on 127.0.0.1, filled in as serves start
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # both ends of every connection
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening, then end every connection (each side sees its peer close)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._open.add(writer)
        try:
            upstream = await self._connect()
            if upstream is None:
                return
            up_reader, up_writer = upstream
            self._open.add(up_writer)
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            self._open.discard(up_writer)
        finally:
            writer.close()
            self._open.discard(writer)
            self._handlers.discard(handler)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        start = next(self._turn)
        for i in range(len(self.backends)):
            port = self.backends[(start + i) % len(self.backends)]
            with contextlib.suppress(OSError):
                return await asyncio.open_connection("127.0.0.1", port)
        return None


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
