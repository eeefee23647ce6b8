"""The success callback: ``GET {callbackUrl}/{bizName}?task_id&state&oss_file&file_type&text``.

Sent in the background with exponential back-off, so it never holds up a worker. ``text`` is
cut to 2000 characters. The hook is best effort: a process that stops drops its pending ones.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

import httpx

from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import cancel_and_wait

log = logging.getLogger(__name__)

TEXT_MAX_CHARS = 2000


def callback_request(
    callback_url: str,
    biz_name: str,
    *,
    task_id: str,
    state: int,
    oss_file: str,
    file_type: str,
    text: str | None,
) -> tuple[str, dict[str, str]]:
    """The URL and query parameters of one callback."""
    url = f"{callback_url.rstrip('/')}/{quote(biz_name, safe='')}"
    params = {"task_id": task_id, "state": str(state), "oss_file": oss_file, "file_type": file_type}
    if text:
        params["text"] = text[:TEXT_MAX_CHARS]
    return url, params


class Callbacks:
    def __init__(self, client: httpx.AsyncClient, attempts: int, backoff: float) -> None:
        self.client = client
        self.attempts = attempts
        self.backoff = backoff
        self._pending: set[asyncio.Task[bool]] = set()

    def send(self, task_id: str, url: str, params: dict[str, str]) -> asyncio.Task[bool]:
        """Start sending in the background; the task's result says whether it was delivered."""
        task = asyncio.create_task(self._deliver(task_id, url, params))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _deliver(self, task_id: str, url: str, params: dict[str, str]) -> bool:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                response = await self.client.get(url, params=params, timeout=10.0)
                if response.status_code < 300:
                    log.info(
                        "task %s: callback delivered to %s", task_id, url, extra=ctx(task=task_id)
                    )
                    return True
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = repr(exc)
            log.warning(
                "task %s: callback attempt %d to %s failed: %s",
                task_id,
                attempt,
                url,
                problem,
                extra=ctx(task=task_id),
            )
            if attempt < self.attempts:
                await asyncio.sleep(delay)
                delay *= 2
        log.error(
            "task %s: callback to %s abandoned after %d attempts",
            task_id,
            url,
            self.attempts,
            extra=ctx(task=task_id),
        )
        return False

    async def aclose(self) -> None:
        """Cancel the callbacks still pending."""
        await cancel_and_wait(list(self._pending))
