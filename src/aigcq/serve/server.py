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
from aigcq.config import PlatformConfig, Settings, load_pools
from aigcq.delivery.custody import SWEEP_S as CUSTODY_SWEEP_S
from aigcq.delivery.custody import Custody
from aigcq.delivery.retention import RETENTION_SWEEP_S, OutboxRetention
from aigcq.gateway.callbacks import callback_routes
from aigcq.gateway.comfy_v2 import ComfyV2
from aigcq.gateway.errors import ClientError
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.hot_paths import HotPaths
from aigcq.gateway.http_api import api_router, client_error_handler
from aigcq.gateway.queue_view import internal_capacity
from aigcq.gateway.result_links import result_links_route
from aigcq.gateway.v2_errors import V2Error, v2_error_handler
from aigcq.gateway.ws import client_endpoint
from aigcq.observability import metrics, otel_metrics
from aigcq.platforms.base import PlatformAdapter
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.registry import specs
from aigcq.platforms.result_files import files_route, result_storage
from aigcq.plumbing.background import every
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.plumbing.events import EventBus
from aigcq.queue.store import TaskStore
from aigcq.runtime import Runtime
from aigcq.scheduler.accounts import Reconciler
from aigcq.scheduler.dispatch import DispatchLoop
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.orphan_checks import OrphanChecks
from aigcq.scheduler.paid import PaidPlatforms
from aigcq.scheduler.poller import Poller, polling_adapters
from aigcq.scheduler.reconcile import MasterWatch
from aigcq.scheduler.shared_keys import shared_keys
from aigcq.scheduler.silence import SilentTasks
from aigcq.scheduler.sweeper import Sweeper
from aigcq.scheduler.targets import InternalTarget, InternalTargetBuilder
from aigcq.serve import shutdown
from aigcq.serve.admin_api import Monitor, admin_router
from aigcq.serve.admin_tasks import admin_tasks_router
from aigcq.serve.api_description import describe_serve
from aigcq.serve.capacity import CapacityPlanner, capacity_router
from aigcq.serve.docs_page import offline_docs, without_422
from aigcq.serve.metrics import ServeState
from aigcq.serve.parts import BackgroundLoop, Extend, Extension

#: where clients connect their WebSocket (seed 001 uses the root)
CLIENT_WS_PATHS = ("/", "/client")

log = logging.getLogger(__name__)

assert platforms  # the package import registers every adapter


def build_adapters(settings: Settings) -> dict[str, PlatformAdapter]:
    """Every registered platform's adapter, but an opt-in one only where its URL is
    configured, and then first: it takes the task platforms it serves (``comfyui``)."""
    built = {
        spec.name: spec.build(settings)
        for spec in specs()
        if not spec.adapter.opt_in or spec.base_url(settings)
    }
    return dict(sorted(built.items(), key=lambda item: not item[1].opt_in))


def runtime(settings: Settings, config: PlatformConfig, redis: Redis) -> Runtime:
    """The parts every component of a serve process shares."""
    adapters = build_adapters(settings)
    store = TaskStore(
        redis,
        settings.project_prefix,
        retention_s=settings.result_retention_s,
        outbox_retention_s=settings.outbox_retention_s,
        free_requeues=settings.max_free_requeues,
        min_replicas=settings.redis_min_replicas,
        wait_timeout_ms=settings.redis_wait_timeout_ms,
    )
    store.paid_targets = ",".join(name for name, a in adapters.items() if a.paid)
    store.usage_terms = f"{settings.share_half_life_s!r} {settings.share_default_run_s!r}"
    client = PlatformClient(
        adapters,
        timeout_s=settings.http_timeout_s,
        max_in_flight=settings.platform_max_in_flight,
        storage=result_storage(settings),  # inline (base64) result files
        file_key=settings.signing_key(),
    )
    store.shared_keys = shared_keys(config, client, settings.external_capacity_max)
    return Runtime(settings=settings, config=config, redis=redis, store=store, platforms=client)


class ServeProcess:
    """One serve process, assembled once from its targets, subscribers, routes and loops."""

    def __init__(
        self,
        settings: Settings,
        config: PlatformConfig,
        redis: Redis,
        internal: InternalTargetBuilder | None = None,
        *,
        retry_failures: bool = False,
        extend: Extend | None = None,
        service_name: str = "aigcq",
    ) -> None:
        """``internal`` builds the internal target (default: a bridge hub at ``/ws``);
        ``retry_failures``: a failed result is retried while attempts last (the
        message-dispatcher's rule); ``extend`` adds routes and loops (see :class:`Extension`);
        ``service_name``: its telemetry's unless ``OTEL_SERVICE_NAME`` names one."""
        self.service_name = service_name
        self.rt = runtime(settings, config, redis)
        storage = self.rt.platforms.storage
        assert storage is not None  # runtime() always gives the platforms one
        self.custody = Custody(settings, storage, redis, self.rt.store.keys)
        self.lifecycle = Lifecycle(self.rt, retry_failures=retry_failures, custody=self.custody)
        wakeup = asyncio.Event()  # set by whoever frees capacity or queues work
        self.hub = None if internal else BridgeHub(self.rt, self.lifecycle, wake=wakeup.set)
        self.internal: InternalTarget | None = (
            internal(self.rt, self.lifecycle) if internal else self.hub
        )
        serves = self.internal.serves if self.internal else ()
        self.paid = PaidPlatforms(self.rt, self.lifecycle, internal_serves=serves)
        for target in (self.paid, *([self.internal] if self.internal else [])):
            self.lifecycle.subscribe(target.task_ended)
        if self.hub is not None:
            self.lifecycle.slot_freed_later = self.hub.slot_freed_later
            self.lifecycle.cancel_told = self.hub.ends.told
        self.dispatch = DispatchLoop(
            self.rt,
            self.lifecycle,
            self.paid,
            self.internal,
            wakeup,
            on_drains=self.hub.apply_drains if self.hub else None,
        )
        self.sweeper = Sweeper(self.rt, self.lifecycle)
        self.orphan_checks = OrphanChecks(self.rt, self.lifecycle)
        self.silent_tasks = SilentTasks(self.lifecycle)
        self.reconciler = Reconciler(self.silent_tasks)
        self.master_watch = MasterWatch(self.rt, [self.hub.after_master_change] if self.hub else [])
        self.gateway = Gateway(self.rt, self.lifecycle, self.internal)
        self.comfy_v2 = ComfyV2(self.gateway)  # the Comfy API v2 door (/api/v2)
        self.lifecycle.subscribe(lambda task_id, *_: self.comfy_v2.task_ended(task_id))
        self.pollers = [Poller(self.rt, self.lifecycle, a) for a in polling_adapters(self.rt)]
        self.events = EventBus(
            redis,
            self.rt.store.keys.events,
            on_wake=wakeup.set,
            on_outbox=self.gateway.clients.notify,
            on_client=self.gateway.clients.replaced,
            on_progress=self._progress,
            on_bridge_end=self.hub.remote_task_end if self.hub else lambda end: None,
            on_capacity=self.hub.peers.changed if self.hub else lambda: None,
        )
        extension = extend(self) if extend else Extension()
        self.monitor = Monitor(self)  # the dashboard's samples
        #: how many instances each pool of pools.json should run (none: no pools)
        self.capacity = CapacityPlanner(self, load_pools(settings.config_dir))
        # booting instances are slots that free when they register: for the dispatch and ETAs
        booting = self.capacity.booting_at
        self.dispatch.booting = self.gateway.queue_updates.estimator.booting = booting
        self.loops: list[BackgroundLoop] = [
            self.events.run,
            self.dispatch.run,
            self.sweeper.run,
            self.orphan_checks.run,
            self.silent_tasks.run,
            self.master_watch.run,
            self.paid.replay_journals,
            self.paid.budgets.run,
            self.reconciler.run,
            self._redeliver,
            self._trim_outboxes,
            self.gateway.clients.keep_present,
            self.gateway.queue_updates.run,
            self._sweep_custody,
            self._sweep_inputs,
            *(p.run for p in self.pollers),
            *([self.internal.run] if self.internal else []),
            self.monitor.run,
            self.capacity.run,
            *extension.loops,
        ]
        self._running: list[asyncio.Task[None]] = []
        self.shutdown_grace_s = 5.0  # hand-offs under way at shutdown may finish this long
        self.callbacks = callback_routes(self.gateway)
        #: what /metrics shows besides the event metrics (and OpenTelemetry exports)
        self.metric_sources = [ServeState(self, self.capacity.desired)]
        self.api = self._build_app(extension)
        self.app = self._hot_paths(self.api)

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

    async def _sweep_custody(self) -> None:
        """Deletes local copies of result files whose links expired, every few minutes."""
        await every(CUSTODY_SWEEP_S, self.custody.sweep, log, "result custody sweep")

    async def _sweep_inputs(self) -> None:
        """Deletes uploaded inputs (/api/v2/assets) past their retention, every few minutes."""
        await every(CUSTODY_SWEEP_S, self.comfy_v2.assets.sweep, log, "uploaded inputs sweep")

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self._running = [asyncio.create_task(loop()) for loop in self.loops]
        log.info("aigcq serving (prefix %s)", self.rt.settings.project_prefix)
        try:
            # metrics through OpenTelemetry if OTEL_* asks: the last export after the
            # hand-backs, while Redis is open
            async with otel_metrics.exporting(self.service_name, self.metric_sources):
                try:
                    yield
                finally:
                    await self._wind_down()
        finally:
            await self.gateway.aclose()
            await self.comfy_v2.aclose()
            await self.rt.platforms.aclose()
            await self.custody.aclose()
            await self.rt.store.aclose()
            log.info("aigcq stopped")

    async def _wind_down(self) -> None:
        """The loops' end, before the connections close."""
        # Stop claiming, let hand-offs finish, requeue what never reached a target.
        await shutdown.hand_back(self, self.shutdown_grace_s)
        # Bounded: a loop stuck in a client library's cleanup must not hang shutdown.
        await cancel_and_wait(self._running, timeout=5.0)
        # the spans of the attempts that just ended (hand-backs too), while Redis is open
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.lifecycle.traces.drain(), 5.0)

    def _progress(self, backend_id: str, message: dict[str, Any]) -> None:
        """Live news of a task: to its client's sockets and to its v2 event streams."""
        self.gateway.clients.progress(backend_id, message)
        self.comfy_v2.progress(backend_id, message)

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

    def _build_app(self, extension: Extension) -> FastAPI:
        app = FastAPI(
            title="aigcq",
            summary="AIGC task queue: internal GPUs first, paid platforms on overflow.",
            lifespan=self.lifespan,
            docs_url=None,
            redoc_url=None,
        )
        offline_docs(app)
        without_422(app)
        describe_serve(app)
        refuse = client_error_handler(self.gateway)
        app.add_exception_handler(ClientError, refuse)
        app.add_exception_handler(RequestValidationError, refuse)
        app.add_exception_handler(V2Error, v2_error_handler)
        app.include_router(self.comfy_v2.router())
        app.include_router(self.comfy_v2.bridge_router())
        app.include_router(api_router(self.gateway, lambda: internal_capacity(self.hub)))
        app.include_router(admin_router(self, self.monitor))
        app.include_router(admin_tasks_router(self.gateway))
        app.include_router(capacity_router(self, self.capacity))
        app.router.routes.extend(self.callbacks)
        for path in CLIENT_WS_PATHS:
            app.add_api_websocket_route(path, self.client_ws)
        if self.hub is not None:
            app.add_api_websocket_route("/ws", self.hub.endpoint)
        app.router.routes.extend(extension.routes)
        for path, endpoint in extension.websockets.items():
            app.add_api_websocket_route(path, endpoint)

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
        scrape = metrics.endpoint(*self.metric_sources, token=self.rt.settings.metrics_token)
        app.add_route("/metrics", scrape, include_in_schema=False)
        app.router.routes.append(files_route(self.rt.platforms.storage))
        app.router.routes.append(result_links_route(self.custody, self.gateway.messages))
        extension.describe(app)
        return app
