"""The hot task endpoints without FastAPI's routing layers.

createTask and getTaskBatch are called once or more per task; matching them through the
router, the exception and exit-stack middleware and the request handler cost about a fifth
of the asynch process's CPU per task. :class:`TaskFastPath` sits in the middleware stack and
answers ``POST /task/createTask`` and ``POST /task/getTaskBatch`` by calling the very same
endpoint functions, turning :class:`AsynchError` into the same error replies; every other
request (and any other exception) takes the normal path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from aigcq.asynch.api_tasks import create_task_route, get_task_batch
from aigcq.asynch.errors import AsynchError
from aigcq.asynch.http import error_response

_ROUTES: dict[str, Callable[[Request], Awaitable[Response]]] = {
    "/task/createTask": create_task_route,
    "/task/getTaskBatch": get_task_batch,
}


class TaskFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = _ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await endpoint(Request(scope, receive))
        except AsynchError as exc:
            response = error_response(exc)
        await response(scope, receive, send)
