"""``aigcq dispatcher``: the standalone message-dispatcher of seed 000.

It is a serve process of its own (:class:`~aigcq.serve.server.ServeProcess`, own Redis key
prefix) whose only target is its bridge hub at ``/ws`` — no paid overflow — plus the API
(:mod:`aigcq.dispatcher.api`), the capacity feed for queue backends
(:mod:`aigcq.dispatcher.capacity`) and the webhook relay that returns results to whoever
submitted them.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from aigcq.config import Messages, PlatformAccount, PlatformConfig, PlatformKinds, Settings
from aigcq.dispatcher.api import PLATFORM, DispatcherApi
from aigcq.dispatcher.auth import DispatcherAuth
from aigcq.dispatcher.cache import CacheQueue
from aigcq.dispatcher.capacity import CapacityFeed
from aigcq.dispatcher.degrade import Degrader
from aigcq.dispatcher.openapi_doc import describe_dispatcher
from aigcq.dispatcher.settings import DispatcherSettings
from aigcq.dispatcher.webhooks import WebhookRelay
from aigcq.mdclient.feed_messages import FEED_PATH
from aigcq.observability import tracing
from aigcq.plumbing.redis_client import redis_client
from aigcq.serve.launch import bind, ensure_secrets, run_with_redis, uvicorn_server
from aigcq.serve.parts import Extension, ServeParts
from aigcq.serve.server import ServeProcess
from aigcq.serve.shutdown import stop_claiming

log = logging.getLogger(__name__)

#: the AIGC project every dispatcher task is queued under.
AIGC = "api"


def core_settings(md: DispatcherSettings, base: Settings) -> Settings:
    """``base`` with the dispatcher's prefix, single port and public URL."""
    return base.model_copy(
        update={
            "project_prefix": md.prefix,
            "ws_port": md.port,
            "callback_port": md.port,
            "bridge_port": 0,
            "callback_url": md.public_url,
            "message_dispatcher_url": "",
        }
    )


def dispatcher_config(md: DispatcherSettings) -> PlatformConfig:
    """One queue, ComfyUI on our bridges only: concurrency 0 leaves nothing to overflow;
    a failed task is tried ``failure_retries`` more times."""
    account = PlatformAccount(concurrency=0, max_attempts=1 + md.failure_retries)
    accounts = {AIGC: {PLATFORM: account}}
    return PlatformConfig(accounts, PlatformKinds(), Messages())


class MessageDispatcher:
    def __init__(self, md: DispatcherSettings, settings: Settings, redis: Redis) -> None:
        if not (md.password and md.jwt_secret):
            raise ValueError("the dispatcher needs a password and a JWT secret")
        self.md = md
        self.auth = DispatcherAuth(md.username, md.password, md.jwt_secret, md.jwt_ttl_s)
        self.service = ServeProcess(
            settings,
            dispatcher_config(md),
            redis,
            retry_failures=True,
            extend=self._parts,
            service_name="aigcq-dispatcher",
        )

    def _parts(self, service: ServeParts) -> Extension:
        """The dispatcher's own parts over its serve process (its only target is its hub)."""
        rt, hub = service.rt, service.hub
        assert hub is not None, "the message-dispatcher runs its own bridge hub"
        self.relay = WebhookRelay(rt.redis, rt.store, attempts=self.md.webhook_attempts)
        self.feed = CapacityFeed(hub, self.auth, on_shrink=self._shrink)
        self.api = DispatcherApi(service, self.auth, AIGC, on_accepted=self.feed.touch)
        self.degrader = Degrader(service.lifecycle, (AIGC, PLATFORM), self.feed)
        self.cache = CacheQueue(
            rt,
            service.lifecycle,
            (AIGC, PLATFORM),
            hub.name,
            self.feed.placed,
            stale_after_s=self.md.stale_after_s,
            interval_s=self.md.cache_interval_s,
        )
        routes: list[BaseRoute] = [*self.api.routes()]
        return Extension(
            routes=routes,
            websockets={FEED_PATH: self.feed.endpoint},
            loops=[self.relay.run, self.feed.run, self.cache.run],
            describe=describe_dispatcher,
        )

    async def _shrink(self, online: int) -> int:
        return await self.degrader.shrink(online)

    @property
    def app(self) -> ASGIApp:
        return self.service.app


def prepare() -> tuple[DispatcherSettings, Settings, dict[str, str]]:
    """Settings from the environment, unset secrets filled in; also those generated now."""
    md = DispatcherSettings()
    settings = core_settings(md, Settings())
    fresh = ensure_secrets(settings)
    fresh |= ensure_secrets(settings, md, ("password", "jwt_secret"), key_prefix="md_")
    return md, settings, fresh


def run(md: DispatcherSettings, settings: Settings) -> None:
    """Serve; start a private Redis first when no ``AIGCQ_REDIS_URL`` is configured."""
    run_with_redis(
        settings,
        dispatcher_config(md),
        embedded_dir=settings.data_dir / "md-redis",
        main=lambda: serve(md, settings),
    )


async def serve(md: DispatcherSettings, settings: Settings) -> None:
    """Run ``aigcq dispatcher`` until SIGINT/SIGTERM."""
    async with tracing.in_process("aigcq-dispatcher"):
        redis = redis_client(settings.redis_url)
        dispatcher = MessageDispatcher(md, settings, redis)
        server = uvicorn_server(
            dispatcher.app, settings, on_exit=lambda: stop_claiming(dispatcher.service)
        )
        log.info("message-dispatcher on %s:%s (prefix %s)", settings.host, md.port, md.prefix)
        try:
            await server.serve(sockets=[bind(settings.host, md.port)])
        finally:
            await redis.aclose()
