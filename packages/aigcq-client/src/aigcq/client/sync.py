"""A blocking facade over :class:`~aigcq.client.aio.AsyncClient` for scripts and threads."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from aigcq.client.aio import AsyncClient

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """The :class:`AsyncClient` coroutine method ``method`` as a blocking :class:`Client` one."""

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(method(self._client, *args, **kwargs))

    return call


class Client:
    """The same client with blocking calls; its event loop runs in a private thread."""

    def __init__(self, url: str, token: str, backend_id: str, *, ack: bool = True) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = AsyncClient(url, token, backend_id, ack=ack)
        try:
            self._call(self._client.connect())
        except BaseException:
            self._stop()
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    submit = _blocking(AsyncClient.submit)
    result = _blocking(AsyncClient.result)
    cancel = _blocking(AsyncClient.cancel)

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self._client.close())
            self._stop()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
