"""A blocking facade over :class:`~aigcq.client.aio.AsyncClient` for scripts and threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aigcq.client.aio import AsyncClient
from aigcq.client.types import Result

T = TypeVar("T")


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

    def submit(
        self,
        platform: str,
        payload: dict[str, Any],
        *,
        task_id: str | None = None,
        aigc: str | None = None,
    ) -> str:
        return self._call(self._client.submit(platform, payload, task_id=task_id, aigc=aigc))

    def result(self, task_id: str, timeout: float | None = None) -> Result:
        return self._call(self._client.result(task_id, timeout))

    def cancel(self, task_id: str) -> str:
        return self._call(self._client.cancel(task_id))

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
