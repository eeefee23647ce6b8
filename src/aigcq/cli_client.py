"""The CLI's submit: one task through the client SDK, with a live status line."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rich.console import Console

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
    """Submit, show progress until the result arrives; returns the result (or the error)."""
    try:
        async with AsyncClient(server, token, backend_id) as client, asyncio.timeout(timeout):
            with console.status("submitting") as status:
                task_id = await client.submit(platform, payload, task_id=task_id, aigc=aigc)
                status.update(f"task {task_id}: queued")
                async for event in client.events(task_id):
                    if isinstance(event, Result):
                        return dataclasses.asdict(event)
                    status.update(f"task {task_id}: {describe(event)}")
    except SubmitError as exc:
        return {"type": "error", "code": exc.code, "msg": exc.msg, "detail": exc.detail}
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
