"""The aigcq client SDK: ``AsyncClient`` (asyncio) and ``Client`` (blocking)::

async with AsyncClient("ws://host:8087/", token, "my-backend") as client:
    task_id = await client.submit("comfyui", {"workflowId": "..."}, aigc="proj")
    result = await client.result(task_id)

The two clients are imported when first named: a program that only reads the error and
result types (the CLI's HTTP commands) loads neither websockets nor asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aigcq.client.types import AigcqError, Event, Progress, Result, SubmitError

if TYPE_CHECKING:
    from aigcq.client.aio import AsyncClient
    from aigcq.client.sync import Client

__all__ = ["AigcqError", "AsyncClient", "Client", "Event", "Progress", "Result", "SubmitError"]


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from aigcq.client.aio import AsyncClient

        return AsyncClient
    if name == "Client":
        from aigcq.client.sync import Client

        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
