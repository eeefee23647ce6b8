"""``aigcq serve`` in-process on a real Redis, with the emulators it overflows to."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tests.fakes.servers import serve_app


@dataclass
class ServiceStack:
    """An in-process ``aigcq serve`` and the RunningHub emulator it overflows to."""

    base: str  # http://127.0.0.1:<port> of the service
    rh: str  # base URL of the emulator
    service: Any  # aigcq.service.server.Service

    @property
    def ws_url(self) -> str:
        return self.base.replace("http", "ws", 1) + "/"

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def service_with_runninghub(
    config_dir: Any,
    redis: Any,
    redis_url: str,
    *,
    models: str,
    emulator: Any,
    token: str,
    **settings: Any,
) -> AsyncIterator[ServiceStack]:
    """``models`` is model.json's text; webhooks come back to the service unless
    ``callback_url`` is given."""
    from aigcq.config import PlatformConfig, Settings
    from aigcq.emulators.runninghub import create_app
    from aigcq.service.server import Service

    (config_dir / "model.json").write_text(models)
    async with serve_app(create_app(emulator)) as rh:
        s = Settings(
            redis_url=redis_url,
            token_secret="t" * 32,
            client_tokens=[token],
            config_dir=config_dir,
            runninghub_url=rh,
            sweep_interval_s=0.1,
            **settings,
        )
        service = Service(s, PlatformConfig.load(config_dir), redis)
        async with serve_app(service.app) as base:
            if "callback_url" not in settings:
                s.callback_url = base
            yield ServiceStack(base, rh, service)
