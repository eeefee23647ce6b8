"""The aigcq client SDK: ``AsyncClient`` (asyncio) and ``Client`` (blocking)::

async with AsyncClient("ws://host:8087/", token, "my-backend") as client:
    task_id = await client.submit("comfyui", {"workflowId": "..."}, aigc="proj")
    result = await client.result(task_id)
"""

from aigcq.client.aio import AsyncClient
from aigcq.client.sync import Client
from aigcq.client.types import AigcqError, Event, Progress, Result, SubmitError

__all__ = ["AigcqError", "AsyncClient", "Client", "Event", "Progress", "Result", "SubmitError"]
