"""Hot paths straight to their endpoint, around the FastAPI application.

Every request through FastAPI passes about eight middleware layers and a linear route
match, and every WebSocket frame we send passes two ``send`` wrappers. For the routes
that carry each task (TASK_END callbacks, the client and bridge sockets) that costs more
than the work itself, so :class:`HotPaths` hands them to their endpoint directly. The
routes stay declared on the FastAPI app too (OpenAPI docs, and the same behaviour for
anything the wrapper passes through).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

WebSocketEndpoint = Callable[[WebSocket], Awaitable[None]]


class HotPaths:
    """An ASGI app: exact-path matches go to their endpoint, the rest to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._http: dict[tuple[str, str], ASGIApp] = {}
        self._websocket: dict[str, WebSocketEndpoint] = {}

    def http(self, route: Route) -> None:
        for method in route.methods or ():
            self._http[(method, route.path)] = route.app

    def websocket(self, path: str, endpoint: WebSocketEndpoint) -> None:
        self._websocket[path] = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            handler = self._http.get((scope["method"], scope["path"]))
            if handler is not None:
                await handler(scope, receive, send)
                return
        elif kind == "websocket":
            endpoint = self._websocket.get(scope["path"])
            if endpoint is not None:
                await endpoint(WebSocket(scope, receive, send))
                return
        await self.app(scope, receive, send)
