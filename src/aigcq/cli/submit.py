"""The CLI's submit: one task through the client SDK, with a live status line."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rich.console import Console
from rich.status import Status

from aigcq.client import AigcqError, AsyncClient, Progress, Result


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
    """Submit, show progress until the result arrives; returns the result (success, failed
    or cancelled) without its empty fields.

    A refused submit (``PlatformError``...), no result within ``timeout`` and a connection
    lost or refused (bad token, server down) raise (:class:`AigcqError`, ``OSError``...).
    """
    async with AsyncClient(server, token, backend_id) as client:
        with console.status("submitting") as status:
            try:
                async with asyncio.timeout(timeout):
                    task_id = await client.submit(platform, payload, task_id=task_id, aigc=aigc)
                    return await _follow(client, task_id, status)
            except TimeoutError:
                msg = f"no result within {timeout:g} s (--timeout)"
                raise AigcqError("Timeout", msg, task_id=task_id) from None


async def _follow(client: AsyncClient, task_id: str, status: Status) -> dict[str, Any]:
    status.update(f"task {task_id}: queued")
    async for event in client.events(task_id):
        if isinstance(event, Result):
            return printable(event)
        status.update(f"task {task_id}: {describe(event)}")
    raise AigcqError("Disconnected", "the server closed the connection", task_id=task_id)


def printable(result: Result) -> dict[str, Any]:
    """The result's fields that carry something (no ``null``s, no outbox entry id)."""
    fields = dataclasses.asdict(result)
    return {k: v for k, v in fields.items() if v is not None and k != "id"}


def describe(progress: Progress) -> str:
    """``running on runninghub``, or ``KSampler [████████░░░░░░░░░░░░] step 2/5`` (the
    node's name; ``node 3`` when the bridge does not send it)."""
    if progress.state is not None:
        return f"{progress.state} on {progress.target}"
    node = f"{progress.node_name} " if progress.node_name else ""
    node = node or (f"node {progress.node} " if progress.node else "")
    if progress.value is None or not progress.max:
        return f"{node}running".lstrip()
    done = max(0, min(20, round(20 * progress.value / progress.max)))
    return f"{node}[{'█' * done}{'░' * (20 - done)}] step {progress.value}/{progress.max}"
