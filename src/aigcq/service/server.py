"""One ``aigcq serve`` process: the runtime, its background loops and the ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.asyncio import Redis

from aigcq import platforms
from aigcq.bridges.hub import BridgeHub
from aigcq.bridges.protocol import failure_of
from aigcq.config import PlatformConfig, Settings
from aigcq.delivery.retention import RETENTION_SWEEP_S, OutboxRetention
from aigcq.gateway.admin_api import admin_router
from aigcq.gateway.callbacks import callback_routes
from aigcq.gateway.errors import ClientError
from aigcq.gateway.hot_paths import HotPaths
from aigcq.gateway.http_api import api_router, client_error_handler
from aigcq.gateway.queue_view import internal_capacity
from aigcq.gateway.service import Gateway
from aigcq.gateway.ws import client_endpoint
from aigcq.observability import metrics
from aigcq.platforms.base import (
    Failed,
    PlatformAdapter,
    ResultOutcome,
    adapter_class,
    registered,
)
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.result_files import files_route, result_storage
from aigcq.plumbing.background import cancel_and_wait, every
from aigcq.plumbing.events import EventBus
from aigcq.queue.store import TaskStore
from aigcq.scheduler.dispatcher import Dispatcher
from aigcq.scheduler.outcomes import Outcomes
from aigcq.scheduler.poller import Poller
from aigcq.scheduler.sweeper import Sweeper
from aigcq.service import shutdown
from aigcq.service.docs_page import offline_docs, without_422
from aigcq.service.metrics import ServiceState
from aigcq.service.parts import BackgroundLoop, InternalTargetBuilder
from aigcq.service.runtime import Runtime

#: where clients connect their WebSocket (seed 001 uses the root)
CLIENT_WS_PATHS = ("/", "/client")

log = logging.getLogger(__name__)

assert platforms  # the package import registers every adapter


def build_adapters(settings: Settings) -> dict[str, PlatformAdapter]:
    return {name: cls(settings.platform_url(name)) for name, cls in registered().items()}


class Service:
    def __init__(
        self,
        settings: Settings,
        config: PlatformConfig,
        redis: Redis,
        internal: InternalTargetBuilder | None = None,
    ) -> None:
        """``internal`` builds the internal target once ``rt`` exists (default: a bridge
        hub); it may add loops to ``background``, which run while the app is up."""
        self.rt = Runtime(
            settings=settings,
            config=config,
            redis=redis,
            store=TaskStore(
                redis,
                settings.project_prefix,
                retention_s=settings.result_retention_s,
                outbox_retention_s=settings.outbox_retention_s,
                free_requeues=settings.max_free_requeues,
            ),
            platforms=PlatformClient(
                build_adapters(settings),
                timeout_s=settings.http_timeout_s,
                max_in_flight=settings.platform_max_in_flight,
                storage=result_storage(settings),  # inline (base64) results, e.g. JimuAI's
                file_key=settings.signing_key(),
            ),
        )
        self.rt.store.paid_targets = ",".join(
            name for name, adapter in self.rt.platforms.adapters.items() if adapter.paid
        )
        self.outcomes = Outcomes(self.rt)
        self.background: list[BackgroundLoop] = []
        target = internal(self.rt, self.outcomes, self.background) if internal else None
        self.hub: BridgeHub | None = None
        if target is None:  # our own bridges, connecting to /ws
            self.hub = BridgeHub(self.rt, self.outcomes, wake=lambda: self.dispatcher.wake())
            self.outcomes.on_task_end = self.hub.task_ended
        self.dispatcher = Dispatcher(self.rt, self.outcomes, target or self.hub)
        if self.hub is not None:  # a task no bridge can run overflows as when all are busy
            self.hub.assigner.overflow = self.dispatcher.overflow
        self.sweeper = Sweeper(self.rt, self.outcomes)
        self.gateway = Gateway(self.rt, self.outcomes)
        self.pollers = [
            Poller(self.rt, self.outcomes, a)
            for a in self.rt.platforms.adapters.values()
            if a.kind == "polling"
        ]
        self.events = EventBus(
            redis,
            self.rt.store.keys.events,
            on_wake=self.dispatcher.wake,
            on_outbox=self.gateway.clients.notify,
            on_client=self.gateway.clients.replaced,
            on_progress=self.gateway.clients.progress,
            on_bridge_end=self.hub.remote_task_end if self.hub else lambda end: None,
        )
        self._loops: list[asyncio.Task[None]] = []
        self.shutdown_grace_s = 5.0  # hand-offs under way at shutdown may finish this long
        self._callback_format = adapter_class("runninghub")("")
        self.callbacks = callback_routes(self.gateway, self.parse_callback)
        self.api = self._build_app()
        self.app = self._hot_paths(self.api)

    def parse_callback(self, body: dict[str, Any]) -> ResultOutcome:
        """TASK_END bodies share RunningHub's format, whichever target sent them (bridges,
        the message-dispatcher and RunningHub itself): no need to know the task first.
        A bridge's failure keeps its class and specific code (see ``docs/bridge-protocol.md``)."""
        outcome = self._callback_format.parse_result(body)
        failure = failure_of(body.get("eventData"))
        if isinstance(outcome, Failed) and failure is not None:
            detail = {"class": failure.failure_class}
            return Failed(failure.code, failure.message, detail=detail)
        return outcome

    async def _redeliver(self) -> None:
        """Covers pub/sub messages lost while a subscription was reconnecting."""

        async def notify_all() -> None:
            self.gateway.clients.notify_all()

        await every(self.rt.settings.sweep_interval_s * 5, notify_all, log, "redelivery sweep")

    async def _trim_outboxes(self) -> None:
        """Drops outbox messages past their retention, about once a minute."""
        retention = OutboxRetention(
            self.rt.redis, self.rt.store.keys, self.rt.settings.outbox_retention_s
        )
        sweep = lambda: retention.sweep(time.time())  # noqa: E731
        await every(RETENTION_SWEEP_S, sweep, log, "outbox retention sweep")

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        runs = [
            self.events.run(),
            self.dispatcher.run(),
            self.sweeper.run(),
            self._redeliver(),
            self._trim_outboxes(),
            *(p.run() for p in self.pollers),
            *([self.hub.health.run(), self.hub.peers.run()] if self.hub else []),
            *(loop() for loop in self.background),
        ]
        self._loops = [asyncio.create_task(r) for r in runs]
        log.info("aigcq serving (prefix %s)", self.rt.settings.project_prefix)
        try:
            yield
        finally:
            # Stop claiming, let hand-offs finish, requeue what never reached a target.
            await shutdown.hand_back(self, self.shutdown_grace_s)
            # Bounded: a loop stuck in a client library's cleanup must not hang shutdown.
            await cancel_and_wait(self._loops, timeout=5.0)
            await self.gateway.aclose()
            await self.rt.platforms.aclose()
            await self.rt.store.aclose()
            log.info("aigcq stopped")

    async def client_ws(self, ws: WebSocket) -> None:
        await client_endpoint(ws, self.gateway)

    def _hot_paths(self, api: FastAPI) -> HotPaths:
        """Callbacks and sockets skip FastAPI's middleware on their way in."""
        app = HotPaths(api)
        for route in self.callbacks:
            app.http(route)
        for path in CLIENT_WS_PATHS:
            app.websocket(path, self.client_ws)
        if self.hub is not None:
            app.websocket("/ws", self.hub.endpoint)
        return app

    def _build_app(self) -> FastAPI:
        app = FastAPI(
            title="aigcq",
            summary="AIGC task queue: internal GPUs first, paid platforms on overflow.",
            lifespan=self.lifespan,
            docs_url=None,
            redoc_url=None,
        )
        offline_docs(app)
        without_422(app)
        refuse = client_error_handler(self.gateway)
        app.add_exception_handler(ClientError, refuse)
        app.add_exception_handler(RequestValidationError, refuse)
        app.include_router(api_router(self.gateway, lambda: internal_capacity(self)))
        app.include_router(admin_router(self))
        app.router.routes.extend(self.callbacks)
        for path in CLIENT_WS_PATHS:
            app.add_api_websocket_route(path, self.client_ws)
        if self.hub is not None:
            app.add_api_websocket_route("/ws", self.hub.endpoint)

        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        async def readyz() -> JSONResponse:
            try:
                await self.rt.redis.ping()
            except Exception as exc:
                return JSONResponse({"status": "redis unavailable", "error": str(exc)}, 503)
            return JSONResponse({"status": "ready"})

        app.add_api_route("/healthz", healthz, methods=["GET"])
        app.add_api_route("/readyz", readyz, methods=["GET"])
        app.add_route("/metrics", metrics.endpoint(ServiceState(self)), include_in_schema=False)
        app.router.routes.append(files_route(self.rt.platforms.storage))
        return app
