"""The CLI's submit: one task through the client SDK, with a live status line."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rich.console import Console
from rich.status import Status

from aigcq.client import AsyncClient, Progress, Result, SubmitError


async def submit_and_wait(
    server: str,
    token: str,
    backend_id: str,
    platform: str,
    payload: dict[str, Any],
    *,
    task_id: str | None,
    aigc: str | None,
    timeout: float,
    console: Console,
) -> dict[str, Any]:
    """Submit, show progress until the result arrives; returns the result (or the error).

    A refused submit (``PlatformError``...) and no result within ``timeout`` come back as
    error results; a refused connection (bad token, server down) raises.
    """
    async with AsyncClient(server, token, backend_id) as client:
        with console.status("submitting") as status:
            try:
                async with asyncio.timeout(timeout):
                    task_id = await client.submit(platform, payload, task_id=task_id, aigc=aigc)
                    return await _follow(client, task_id, status)
            except SubmitError as exc:
                return {"type": "error", "code": exc.code, "msg": exc.msg, "detail": exc.detail}
            except TimeoutError:
                msg = f"no result within {timeout:g} s"
                return {"type": "error", "taskId": task_id, "code": "Timeout", "msg": msg}


async def _follow(client: AsyncClient, task_id: str, status: Status) -> dict[str, Any]:
    status.update(f"task {task_id}: queued")
    async for event in client.events(task_id):
        if isinstance(event, Result):
            return dataclasses.asdict(event)
        status.update(f"task {task_id}: {describe(event)}")
    return {"type": "error", "taskId": task_id, "code": "Disconnected"}


def describe(progress: Progress) -> str:
    """``running on runninghub`` or ``[#####...] 5/20 KSampler``."""
    if progress.state is not None:
        return f"{progress.state} on {progress.target}"
    bar = ""
    if progress.value is not None and progress.max:
        done = round(20 * progress.value / progress.max)
        bar = f"[{'#' * done}{'.' * (20 - done)}] "
    return f"{bar}{progress.value}/{progress.max} {progress.node or ''}".rstrip()
