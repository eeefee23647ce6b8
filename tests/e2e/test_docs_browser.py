"""``/docs`` in real headless Chromium: Swagger UI shows an Authorize button offering the
client and admin tokens, and lists the callbacks and the WebSocket routes. A screenshot
goes to ``test-artifacts/docs/``. Skipped when no Chromium is installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.serve.server import ServeProcess
from tests.e2e.test_dashboard_browser import ARTIFACTS, chromium_path  # noqa: F401 (fixture)
from tests.fakes.browser import chromium
from tests.fakes.servers import serve_app

pytestmark = pytest.mark.e2e

SECRET = "docs-secret-with-at-least-32-bytes-of-key"
OPERATIONS = "[...document.querySelectorAll('.opblock-summary-path')].map(e => e.innerText)"
AUTH_DIALOG = "[...document.querySelectorAll('.auth-container h4')].map(e => e.innerText)"


async def test_docs_offer_the_tokens_and_list_callbacks_and_sockets(
    chromium_path: str,  # noqa: F811
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
) -> None:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url, token_secret=SECRET, config_dir=tmp_path, admin_token="adm",
        bridge_token="brt",
    )  # fmt: skip
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with serve_app(service.app) as base, chromium(chromium_path, profile) as page:
        await page.goto(f"{base}/docs")
        await page.wait_for("!!document.querySelector('.btn.authorize')", within=30)
        listed = await page.wait_for(f"{OPERATIONS}.length > 10 && {OPERATIONS}")
        assert {"/callback/all", "/", "/client", "/ws", "/api/tasks"} <= set(listed), listed
        await page.eval("document.querySelector('.btn.authorize').click()")
        offered = await page.wait_for(f"{AUTH_DIALOG}.length && {AUTH_DIALOG}")
        assert any("clientToken" in h for h in offered), offered
        assert any("adminToken" in h for h in offered), offered
        await page.screenshot(ARTIFACTS.parent / "docs" / "authorize.png")
