"""The dashboard in real headless Chromium: an in-process server with a test bridge (2 GPUs)
and the RunningHub emulator; the page loads, its live counts follow the tasks, drain works.
Screenshots go to ``test-artifacts/dashboard/``. Skipped when no Chromium is installed."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.serve import admin_trends
from aigcq.serve.server import ServeProcess
from tests.fakes.asynch import fake_asynch
from tests.fakes.bridge import BRIDGE_TOKEN, PROMPT_INVALID, Bridge, task_end
from tests.fakes.browser import Page, chromium, find_chromium
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e

ADMIN = "dashboard-admin-token"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
GPU_SECONDS = 2.0


@pytest.fixture
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium found (install Debian's `chromium` or set AIGCQ_CHROMIUM)")
    try:
        subprocess.run([path, "--version"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"Chromium at {path} does not run: {exc}")
    return path


@pytest.fixture
async def env(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Env]:
    monkeypatch.setattr(admin_trends, "TREND_EVERY_S", 1.0)  # the hour's chart moves at once
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 2}}}')
    emulator = RunningHubEmulatorConfig(duration_s=GPU_SECONDS, max_concurrent=2)
    async with serve_app(create_app(emulator)) as rh, serve_app(fake_asynch(ADMIN)) as asynch:
        settings = Settings(
            redis_url=redis_url,
            token_secret=SECRET,
            config_dir=tmp_path,
            bridge_token=BRIDGE_TOKEN,
            admin_token=ADMIN,
            runninghub_url=rh,
            sweep_interval_s=0.2,
            overflow_price={"runninghub": 0.25},
            asynch_url=asynch,
        )
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
        async with serve_app(service.app) as base:
            settings.callback_url = base  # RunningHub's webhooks come back here
            env = Env(int(base.rsplit(":", 1)[1]), redis, service)
            yield env
            for ws in env.sockets:
                await ws.close()


@contextlib.asynccontextmanager
async def gpus(env: Env, count: int = 2) -> AsyncIterator[Bridge]:
    """A bridge that acknowledges every task and ends it after GPU_SECONDS: successfully,
    or (ids starting with ``bad``) as ComfyUI refusing its prompt."""
    bridge = await env.bridge()
    vram = {"device": "NVIDIA L4", "vramTotal": 24 * 2**30, "vramFree": 6 * 2**30}
    instances = [
        {"instanceId": f"gpu{i}:8188", "url": f"http://gpu{i}:8188", "state": "idle", **vram}
        for i in range(count)
    ]
    await bridge.register(count=count, instances=instances)

    async def finish(task_id: str, webhook: str) -> None:
        await asyncio.sleep(GPU_SECONDS)  # time: the fake GPU works this long on a task
        failure = PROMPT_INVALID if task_id.startswith("bad") else None  # ComfyUI's 400
        await task_end(env, webhook, failure=failure)

    async def serve() -> None:
        async with asyncio.TaskGroup() as running:
            while True:
                msg = await bridge.next(timeout=3600)
                if msg["type"] == "TASK_ASSIGN":
                    await bridge.ack(msg["data"]["taskId"])
                    running.create_task(finish(msg["data"]["taskId"], msg["data"]["webhookUrl"]))

    loop = asyncio.create_task(serve())
    try:
        yield bridge
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loop


def cell(table: str, row_text: str, column: int) -> str:
    """JS: the text of ``column`` in the first row of ``table`` containing ``row_text``."""
    return (
        f"([...document.querySelectorAll('#{table} tbody tr')]"
        f".filter(r => r.textContent.includes({row_text!r}))"
        f".map(r => r.cells[{column}].textContent)[0] || '')"
    )


async def submit(client: Client, ids: list[str]) -> None:
    for task_id in ids:
        await client.request(generate(task_id))


async def test_dashboard_shows_live_tasks_and_drains_a_bridge(
    chromium_path: str, env: Env, tmp_path: Path
) -> None:
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with gpus(env), chromium(chromium_path, profile) as page:
        await page.goto(f"{env.base}/dashboard?token={ADMIN}")
        assert await page.eval("location.search") == ""  # the token left the address bar
        await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'")
        assert await page.eval("document.querySelector('#health').textContent") == "healthy"
        gpu0 = "gpu0:8188 idle (NVIDIA L4, 6.0/24.0 GiB free)"  # each instance's device, VRAM
        assert gpu0 in await page.eval(cell("bridges", "br1", 2))
        await page.screenshot(ARTIFACTS / "01-loaded.png")

        client = await env.client()
        await submit(client, [f"t{i}" for i in range(6)])  # 2 GPUs, 2 RunningHub, 2 wait
        await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'busy'")
        await page.wait_for(f"{cell('queues', 'comfyui', 3)} === 'bridge: 2, runninghub: 2'")
        await page.wait_for(f"{cell('queues', 'comfyui', 2)} === '2'")  # waiting
        assert await page.eval(cell("queues", "comfyui", 4)) == "bridge: 2, runninghub: 2"
        assert (await page.eval(cell("queues", "comfyui", 5))).endswith(" s")  # oldest wait
        await page.screenshot(ARTIFACTS / "02-tasks-flowing.png")

        totals = "document.querySelector('#split-totals').textContent"
        await page.wait_for(f"/internal [1-9]/.test({totals}) && /external [1-9]/.test({totals})")
        await page.wait_for(f"{cell('queues', 'comfyui', 2)} === '0'", within=15)
        await page.screenshot(ARTIFACTS / "03-split-chart.png")

        await drain_from_the_page(env, page, client)
        await show_timeline(page, "t0")
        await show_why_a_task_failed(env, page, client)
        await show_spend_and_asynch(page)
        await filter_recent_tasks(page)
        await retry_only_what_failed(env, page, client)
        await every_panel_fits_and_shows_data(page)
        await client.close()


async def drain_from_the_page(env: Env, page: Page, client: Client) -> None:
    """Drain br1 with its button: new tasks go to RunningHub; undrain brings it back."""
    idle = "bridge: 0, runninghub: 0"
    await page.wait_for(f"{cell('queues', 'comfyui', 3)} === {idle!r}", within=15)
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'")
    await click_bridge_button(page, "Drain")
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'drained'")
    assert await page.eval(cell("bridges", "br1", 3)) == "0"  # free
    await submit(client, ["d1"])
    task = await until(partial(env.task, "d1"), lambda t: t.target != "")
    assert task.target == "runninghub"
    await page.screenshot(ARTIFACTS / "04-drained.png")
    await click_bridge_button(page, "Undrain")
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'")
    await submit(client, ["u1"])
    assert (await until(partial(env.task, "u1"), lambda t: t.target != "")).target == "bridge"


async def click_bridge_button(page: Page, label: str) -> None:
    assert await page.eval(cell("bridges", "br1", 8)) == label
    await page.eval(
        "[...document.querySelectorAll('#bridges tbody tr')]"
        ".find(r => r.cells[0].textContent === 'br1').querySelector('button').click()"
    )


async def search(page: Page, task_id: str) -> list[list[str]]:
    """Show ``task_id``'s timeline; its rows' cells."""
    await page.eval(
        "document.querySelector('#timeline')?.remove();"
        f"document.querySelector('#task-id').value = {task_id!r};"
        "document.querySelector('#search').requestSubmit()"
    )
    rows: list[list[str]] = await page.wait_for(
        "[...document.querySelectorAll('#timeline tr')].slice(1)"
        ".map(r => [...r.cells].map(c => c.textContent))"
    )
    return rows


async def task_buttons(page: Page) -> list[str]:
    labels: list[str] = await page.eval(
        "[...document.querySelectorAll('#task button')].map(b => b.textContent)"
    )
    return labels


async def show_timeline(page: Page, task_id: str) -> None:
    """Search a task: its timeline runs from submission to success, to the millisecond; a
    finished task offers neither Cancel nor Retry."""
    rows = await search(page, task_id)
    assert rows[0][1] == "pending" and rows[-1][1] == "success"
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", row[0]) for row in rows), rows
    assert await task_buttons(page) == []
    await page.screenshot(ARTIFACTS / "05-task-timeline.png")


async def show_why_a_task_failed(env: Env, page: Page, client: Client) -> None:
    """A failed task's panel gives its failure's code, class and message."""
    await submit(client, ["bad1"])
    await until(partial(env.task, "bad1"), lambda t: t.state == "failed", within=15)
    rows = await search(page, "bad1")
    assert rows[-1][1] == "failed"
    part = "document.querySelector('#task-failure .failure-{}')?.textContent".format
    assert await page.eval(part("code")) == "PromptValidation"
    assert await page.eval(part("class")) == "task"
    assert await page.eval(part("message")) == PROMPT_INVALID["message"]
    line = await page.eval("document.querySelector('#task-failure').textContent")
    assert line == f"failure: PromptValidation (task): {PROMPT_INVALID['message']}"
    assert await task_buttons(page) == ["Retry"]
    await page.screenshot(ARTIFACTS / "05b-task-failure.png")


async def retry_only_what_failed(env: Env, page: Page, client: Client) -> None:
    """A waiting task offers Cancel; once cancelled, Retry (and no Cancel)."""
    await env.service.hub.drain("br1", True)  # type: ignore[union-attr]
    await submit(client, [f"w{i}" for i in range(3)])  # RunningHub takes 2, one waits
    live = [t for t in ("w0", "w1", "w2") if (await env.task(t)).state == "pending"]
    assert live, "no waiting task"
    await search(page, live[0])
    assert await task_buttons(page) == ["Cancel"]
    await page.eval("document.querySelector('#task button').click()")
    await page.wait_for("document.querySelector('#task p')?.textContent.includes('cancelled')")
    assert await task_buttons(page) == ["Retry"]
    await env.service.hub.drain("br1", False)  # type: ignore[union-attr]


async def filter_recent_tasks(page: Page) -> None:
    """The recent tasks filter by state, client, platform and target."""
    select = "document.querySelector('#filter-target')"
    change = "new Event('change', {bubbles: true})"  # as a person's choice does
    await page.wait_for(f"[...{select}.options].some(o => o.value === 'runninghub')")
    await page.eval(f"{select}.value = 'runninghub'; {select}.dispatchEvent({change})")
    targets = await page.eval(
        "[...document.querySelectorAll('#recent tbody tr')].map(r => r.cells[4].textContent)"
    )
    assert targets and set(targets) == {"runninghub"}, targets
    await page.eval(f"{select}.value = ''; {select}.dispatchEvent({change})")


PANELS_WITH_DATA = {
    "bridges": "#bridges tbody tr",
    "queues": "#queues tbody tr",
    "queue-chart": "#queue-chart polyline[points*=' ']",
    "split-chart": "#split-chart polyline[points*=' ']",
    "overflow": "#overflow tbody tr",
    "spend-chart": "#spend-chart polyline[points*=' ']",
    "asynch": "#asynch-models tbody tr",
    "health": "#health-history li",
    "recent": "#recent tbody tr",
}


async def every_panel_fits_and_shows_data(page: Page) -> None:
    """At a wide and a narrow window: no panel scrolls sideways, and each shows data from
    this run (the latency figures too)."""
    assert re.search(
        r"p50 [\d.]+ s", await page.eval("document.querySelector('#latency').textContent")
    )
    for width in (1400, 900):
        await page.resize(width, 1000)
        shown = int(await page.eval("Number(document.body.dataset.snapshots || 0)"))
        # a fresh snapshot laid out at this width (the count goes up once it is rendered)
        await page.wait_for(f"Number(document.body.dataset.snapshots) > {shown}")
        overflowing = await page.eval(
            "[...document.querySelectorAll('main > section:not([hidden])')]"
            ".filter(s => s.scrollWidth > s.clientWidth + 1)"
            ".map(s => s.querySelector('h2').textContent)"
        )
        assert overflowing == [], (width, overflowing)
        page_width = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        assert await page.eval(page_width), width  # nor does the page
        for panel, selector in PANELS_WITH_DATA.items():
            assert await page.eval(f"document.querySelectorAll({selector!r}).length"), panel
        await page.screenshot(ARTIFACTS / f"07-all-panels-{width}px.png")


async def show_spend_and_asynch(page: Page) -> None:
    """Overflow spend counts the tasks RunningHub took (this process: ≥ 2 at 0.25 each,
    plus d1); the model-asynch panel shows its models and recent tasks."""
    spent = await page.wait_for(
        f"+{cell('overflow', 'runninghub', 1)} >= 3 && {cell('overflow', 'runninghub', 2)}"
    )
    assert float(spent) >= 0.75
    assert "per process" in await page.eval("document.querySelector('#overflow-total').textContent")
    assert await page.eval("document.querySelector('#asynch-panel').hidden") is False
    await page.wait_for(f"{cell('asynch-models', 'sdxl', 2)} === '3 / 20'")
    assert await page.eval(cell("asynch-models", "sdxl", 3)) == "2 / 2 per tenant"
    assert await page.eval(cell("asynch-recent", "a1", 3)) == "running"
    await page.eval("document.querySelector('#asynch-panel').scrollIntoView()")
    await page.screenshot(ARTIFACTS / "06-overflow-spend-and-asynch.png")
