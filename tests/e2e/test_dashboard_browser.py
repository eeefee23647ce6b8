"""The dashboard in real headless Chromium: an in-process server with a test bridge (2 GPUs)
and the RunningHub emulator; the page loads, its live counts and live task list follow the
tasks (where each runs, paged, filtered, cancelled from its row), drain works, the charts
have axes with units, failures show their reason, and at 1400 and 900 px nothing clips.
Screenshots go to ``test-artifacts/dashboard/``. Skipped when no Chromium is installed."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.serve import admin_trends
from aigcq.serve.server import ServeProcess
from tests.fakes.asynch import fake_asynch
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge, task_end
from tests.fakes.browser import Page, chromium, find_chromium
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until, wait_until

pytestmark = pytest.mark.e2e

ADMIN = "dashboard-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
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
    request: pytest.FixtureRequest,
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Env]:
    """Serve with RunningHub priced at 0.25 a task (``False`` as the fixture's parameter: no
    price set)."""
    priced = getattr(request, "param", True)
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
            overflow_price={"runninghub": 0.25} if priced else {},
            asynch_url=asynch,
        )
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
        async with serve_app(service.app) as base:
            settings.callback_url = base  # RunningHub's webhooks come back here
            env = Env(int(base.rsplit(":", 1)[1]), redis, service)
            yield env
            for ws in env.sockets:
                await ws.close()


@dataclass
class Gpus:
    """The test bridge: tasks named ``hold-…`` run until ``release`` is set; ``bad-…``
    fail as a bridge reports an invalid prompt."""

    bridge: Bridge
    release: asyncio.Event


BAD_PROMPT = {"class": "task", "code": "PromptValidation", "message": "width 4096 bigger than max"}


@contextlib.asynccontextmanager
async def gpus(env: Env, count: int = 2) -> AsyncIterator[Gpus]:
    """A bridge that acknowledges every task, reports which instance runs it, and ends it
    after GPU_SECONDS (successfully but for ``bad-…``)."""
    bridge = await env.bridge()
    vram = {"device": "NVIDIA L4", "vramTotal": 24 * 2**30, "vramFree": 6 * 2**30}
    instances = [
        {"instanceId": f"gpu{i}:8188", "url": f"http://gpu{i}:8188", "state": "idle", **vram}
        for i in range(count)
    ]
    await bridge.register(count=count, instances=instances)
    gpus = Gpus(bridge, asyncio.Event())

    async def report() -> None:
        free = sum(i["state"] == "idle" for i in instances)
        data = {"instanceCount": count, "availableInstanceCount": free, "instances": instances}
        await bridge.send("HEARTBEAT", data)

    async def run(task_id: str, webhook: str) -> None:
        instance = next((i for i in instances if i["state"] == "idle"), {})
        instance.update(state="busy", taskId=task_id)
        await bridge.ack(task_id)
        await report()
        if task_id.startswith("hold-"):
            await gpus.release.wait()
        else:
            await asyncio.sleep(GPU_SECONDS)  # time: the fake GPU works this long on a task
        await task_end(env, webhook, failure=BAD_PROMPT if task_id.startswith("bad-") else None)
        instance.update(state="idle", taskId=None)
        await report()

    async def serve() -> None:
        async with asyncio.TaskGroup() as running:
            while True:
                msg = await bridge.next(timeout=3600)
                if msg["type"] == "TASK_ASSIGN":
                    data = msg["data"]
                    running.create_task(run(data["taskId"], data["webhookUrl"]))

    loop = asyncio.create_task(serve())
    try:
        yield gpus
    finally:
        gpus.release.set()
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


def live_column(column: int) -> str:
    """JS: column ``column`` of every row of the live task list."""
    rows = "document.querySelectorAll('#live tbody tr:not(.none)')"  # not "nothing waits"
    return f"[...{rows}].map(r => r.cells[{column}].textContent)"


BRIDGE_DETAIL = (
    "([...document.querySelectorAll('#bridges tbody tr')]"
    ".find(r => r.cells[0].textContent === 'br1')?.nextElementSibling?.textContent || '')"
)


async def test_dashboard_shows_live_tasks_and_drains_a_bridge(
    chromium_path: str, env: Env, tmp_path: Path
) -> None:
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with gpus(env) as fleet, chromium(chromium_path, profile) as page:
        await page.goto(f"{env.base}/dashboard?token={ADMIN}")
        assert await page.eval("location.search") == ""  # the token left the address bar
        await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'")
        assert await page.eval("document.querySelector('#health').textContent") == "healthy"
        gpu0 = "gpu0:8188 idle (NVIDIA L4, 6.0/24.0 GiB free)"  # each instance's device, VRAM
        assert gpu0 in await page.eval(BRIDGE_DETAIL)
        await page.screenshot(ARTIFACTS / "01-loaded.png")

        client = await env.client()
        await submit(client, [f"t{i}" for i in range(6)])  # 2 GPUs, 2 RunningHub, 2 wait
        await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'busy'")
        await follow_the_live_list(page)
        await page.wait_for(f"{cell('queues', 'comfyui', 3)} === 'bridge: 2, runninghub: 2'")
        await page.wait_for(f"{cell('queues', 'comfyui', 2)} === '2'")  # waiting
        assert await page.eval(cell("queues", "comfyui", 4)) == "bridge: 2, runninghub: 2"
        assert (await page.eval(cell("queues", "comfyui", 5))).endswith(" s")  # oldest wait
        await the_now_caption_reads_as_the_table(page)
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
        await a_failure_shows_its_reason(page, client)
        await retry_only_what_failed(env, page, client)
        await every_chart_has_axes_with_units(page)
        await a_busy_fleet(env, page, client, fleet)
        await client.close()


async def test_the_controls_panel_pauses_cancels_by_filter_and_resumes(
    chromium_path: str, env: Env, tmp_path: Path
) -> None:
    """Pause the project from the form: its new tasks wait (RunningHub has room); a
    preview names them, Apply cancels them; Resume in the pause's row lifts it."""
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{env.base}/dashboard#token={ADMIN}")
        await page.wait_for(f"{cell('pauses', 'nothing', 0)} === 'nothing is paused'")
        await page.eval(
            "document.querySelector('#pause-name').value = 'proj';"
            "document.querySelector('#pause-note').value = 'incident 7';"
            "document.querySelector('#pause-form').requestSubmit()"
        )
        await page.wait_for(f"{cell('pauses', 'proj', 2)} === 'incident 7'")
        client = await env.client()
        await submit(client, ["h1", "h2"])
        await page.wait_for(f"{cell('queues', 'comfyui', 2)} === '2'")  # held, not sent
        held_by = f"{cell('queues', 'comfyui', 6)} === 'project proj paused (incident 7)'"
        await page.wait_for(held_by)  # what holds them, next to the queue (issue 41 §2)
        result = "document.querySelector('#bulk-result').textContent"
        await page.eval(
            "document.querySelector('#bulk-project').value = 'proj';"
            "document.querySelector('#bulk-since').value = '5';"
            "document.querySelector('#bulk-preview').click()"
        )
        assert await page.wait_for(f"/^2 match/.test({result}) && {result}") == "2 match: h1 h2"
        await page.screenshot(ARTIFACTS / "10-controls.png", "#controls")
        await page.eval("document.querySelector('#bulk-form').requestSubmit()")
        await page.wait_for(f"{result} === 'cancelled 2'")
        await page.wait_for(f"{cell('queues', 'comfyui', 2)} === '0'")
        await page.eval(
            "[...document.querySelectorAll('#pauses tbody button')]"
            ".find(b => b.textContent === 'Resume').click()"
        )
        await page.wait_for(f"{cell('pauses', 'nothing', 0)} === 'nothing is paused'")
        await submit(client, ["r1"])
        assert (await until(partial(env.task, "r1"), lambda t: t.target != "")).target == (
            "runninghub"
        )
        await client.close()


@pytest.mark.parametrize("env", [False], indirect=True)  # no AIGCQ_OVERFLOW_PRICE
async def test_without_a_token_the_page_says_where_it_is_and_no_price_reads_so(
    chromium_path: str, env: Env, tmp_path: Path
) -> None:
    """No token: the hint names the link `aigcq up` and the demo print and the secrets
    file, and takes a pasted token. No price set: spend reads so, not 0.00."""
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{env.base}/dashboard")
        status = "document.querySelector('#status').textContent"
        hint = await page.wait_for(f"{status}.startsWith('admin token required') && {status}")
        assert "`aigcq up`" in hint and "`aigcq up --demo`" in hint and "secrets.json" in hint
        assert await page.eval("document.querySelector('#token-form').hidden") is False
        await page.screenshot(ARTIFACTS / "09-no-token.png")
        await page.eval(
            f"document.querySelector('#token-input').value = {ADMIN!r};"
            "document.querySelector('#token-form').requestSubmit()"
        )
        live = f"document.readyState === 'complete' && {status} === 'live'"
        await wait_until(lambda: page.eval(live), 10, 0.1, ignore=(RuntimeError,))  # reloads
        assert await page.eval("document.querySelector('#token-form').hidden") is True

        client = await env.client()
        await submit(client, ["p1"])  # no bridge: RunningHub takes it
        await page.wait_for(f"+{cell('overflow', 'runninghub', 1)} >= 1", within=15)
        assert await page.eval(cell("overflow", "runninghub", 2)) == "no price set"
        assert await page.eval(cell("overflow", "runninghub", 3)) == "-"  # not 0.00
        total = await page.eval("document.querySelector('#overflow-total').textContent")
        assert "no price set: AIGCQ_OVERFLOW_PRICE" in total and "0.00" not in total, total
        spend_chart = "document.querySelector('#spend-chart').getBoundingClientRect().height"
        assert await page.eval(spend_chart) == 0  # no chart of a spend that means nothing
        # the fleet's figures too, once RunningHub's task ended (charged, reporting no money)
        await page.wait_for(f"{cell('spend-workflows', 'runninghub', 3)} === '1'", within=15)
        assert await page.eval(cell("spend-projects", "proj", 1)) == "no price set"
        assert await page.eval(cell("spend-workflows", "runninghub", 2)) == "no price set"
        await page.eval("document.querySelector('#overflow').scrollIntoView()")
        await page.screenshot(ARTIFACTS / "09-no-price.png")
        await client.close()


async def follow_the_live_list(page: Page) -> None:
    """The six tasks in the live list: two queued, two on the bridge's instances, two on
    RunningHub with its remote ids; how long each has been in its state."""
    await page.wait_for(f"{live_column(0)}.length === 6")
    await page.wait_for(f"{live_column(3)}.filter(w => w === 'queued').length === 2")
    await page.wait_for(
        f"{live_column(3)}.filter(w => /^br1 \\/ gpu[01]:8188$/.test(w)).length === 2"
    )
    await page.wait_for(f"{live_column(3)}.filter(w => w === 'runninghub').length === 2")
    remote = (
        "[...document.querySelectorAll('#live tbody tr')].map(r => r.cells[3].firstChild.title)"
    )
    assert any(re.fullmatch(r"runninghub task \S+", t) for t in await page.eval(remote))
    assert all(re.fullmatch(r"\d+(\.\d)? s", f) for f in await page.eval(live_column(5)))
    counts = await page.eval("document.querySelector('#live-counts').textContent")
    assert re.fullmatch(r"\d running · \d dispatching · \d waiting", counts), counts
    assert "gpu0:8188 busy with t" in await page.eval(BRIDGE_DETAIL)  # the task it runs


async def the_now_caption_reads_as_the_table(page: Page) -> None:
    """The queue chart's "now" is the Queues table's figures (the chart samples every 10 s,
    its last point is now)."""
    both = await page.eval(
        "[document.querySelector('#queue-now').textContent,"
        f" {cell('queues', 'comfyui', 2)}, {cell('queues', 'comfyui', 3)},"
        f" {cell('queues', 'comfyui', 5)}]"
    )
    caption, waiting, in_flight, oldest = both
    flying = sum(int(n) for n in re.findall(r": (\d+)", in_flight))
    expected = f"now: {waiting} waiting, {flying} in flight"
    expected += f", oldest waiting {oldest}" if waiting != "0" else ""  # the table says "-"
    assert caption == expected, both


async def drain_from_the_page(env: Env, page: Page, client: Client) -> None:
    """Drain br1 with its button: new tasks go to RunningHub; undrain brings it back."""
    idle = "bridge: 0, runninghub: 0"
    await page.wait_for(f"{cell('queues', 'comfyui', 3)} === {idle!r}", within=15)
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'")
    await click_bridge_button(page, "Drain")
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'drained'")
    assert await page.eval(cell("bridges", "br1", 3)) == "0"  # free
    assert await page.eval(cell("bridges", "br1", 7)) == "in"  # rotation
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
    await submit(client, ["bad-panel"])
    await until(partial(env.task, "bad-panel"), lambda t: t.state == "failed", within=15)
    rows = await search(page, "bad-panel")
    assert rows[-1][1] == "failed"
    part = "document.querySelector('#task-failure .failure-{}')?.textContent".format
    assert await page.eval(part("code")) == "PromptValidation"
    assert await page.eval(part("class")) == "task"
    assert await page.eval(part("message")) == BAD_PROMPT["message"]
    line = await page.eval("document.querySelector('#task-failure').textContent")
    assert line == f"failure: PromptValidation (task): {BAD_PROMPT['message']}"
    assert await task_buttons(page) == ["Retry"]
    await page.screenshot(ARTIFACTS / "05b-task-failure.png")


async def retry_only_what_failed(env: Env, page: Page, client: Client) -> None:
    """A waiting task offers Cancel; once cancelled, Retry (and no Cancel); once retried,
    the panel follows it to success by itself."""
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
    await page.eval("document.querySelector('#task button').click()")
    await page.wait_for("document.querySelector('#task p')?.textContent.includes('success')", 15)
    await page.screenshot(ARTIFACTS / "05-retried-to-success.png")


async def a_failure_shows_its_reason(page: Page, client: Client) -> None:
    """A task the bridge fails shows why in the recent tasks: code, class and message, as
    its panel does."""
    await page.wait_for(f"{cell('bridges', 'br1', 1)} === 'idle'", within=15)
    await submit(client, ["bad-1"])
    await page.wait_for(f"{cell('recent', 'bad-1', 1)} === 'failed'", within=15)
    reason = await page.eval(
        "[...document.querySelectorAll('#recent tbody tr')]"
        ".find(r => r.cells[0].textContent === 'bad-1').nextElementSibling.textContent"
    )  # on a line of its own, under the task
    assert reason == "PromptValidation (task): width 4096 bigger than max", reason


async def filter_recent_tasks(page: Page) -> None:
    """The recent tasks filter by state, client, platform and target."""
    select = "document.querySelector('#filter-target')"
    change = "new Event('change', {bubbles: true})"  # as a person's choice does
    await page.wait_for(f"[...{select}.options].some(o => o.value === 'runninghub')")
    await page.eval(f"{select}.value = 'runninghub'; {select}.dispatchEvent({change})")
    targets = await page.eval(
        "[...document.querySelectorAll('#recent tbody tr:not(.detail-row)')]"
        ".map(r => r.cells[4].textContent)"
    )
    assert targets and set(targets) == {"runninghub"}, targets
    await page.eval(f"{select}.value = ''; {select}.dispatchEvent({change})")


PANELS_WITH_DATA = {
    "bridges": "#bridges tbody tr",
    "queues": "#queues tbody tr",
    "queue-chart": "#queue-chart polyline[points*=' ']",
    "wait-chart": "#wait-chart polyline[points*=' ']",
    "split-chart": "#split-chart rect.bar",
    "overflow": "#overflow tbody tr",
    "spend-chart": "#spend-chart polyline[points*=' ']",
    "spend-today": "#spend-workflows tbody tr",
    "asynch": "#asynch-models tbody tr",
    "health": "#health-history li",
    "live": "#live tbody tr button",
    "recent": "#recent tbody tr",
}
#: each chart's unit: tasks and seconds are never on one axis
UNITS = {
    "queue-chart": "tasks",
    "wait-chart": "oldest wait, seconds",
    "split-chart": "tasks finished per 10 s",
    "spend-chart": "cost",
}


async def every_chart_has_axes_with_units(page: Page) -> None:
    """Each chart: its unit above a value axis with round ticks (whole ones for tasks) from
    0, and clock times along the time axis."""
    for chart, unit in UNITS.items():
        svg = f"document.querySelector('#{chart}')"
        assert await page.eval(f"{svg}.querySelector('text.unit').textContent") == unit
        y_ticks = (await page.eval(f"{svg}.dataset.yTicks")).split("|")
        x_ticks = (await page.eval(f"{svg}.dataset.xTicks")).split("|")
        assert len(y_ticks) >= 2 and float(y_ticks[0]) == 0, (chart, y_ticks)
        assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in x_ticks), (chart, x_ticks)
        if unit.startswith("tasks"):
            assert all(re.fullmatch(r"\d+", t) for t in y_ticks), (chart, y_ticks)
    await page.eval("document.querySelector('#queue-chart').scrollIntoView()")
    await page.screenshot(ARTIFACTS / "06-charts.png")


async def a_busy_fleet(env: Env, page: Page, client: Client, fleet: Gpus) -> None:
    """Both GPUs held by long ids, RunningHub full and 40 more waiting: the live list pages
    and filters them, a row's Cancel cancels it, and at 1400 and 900 px nothing clips and
    no task id breaks."""
    held = [f"hold-{uuid.uuid4()}" for _ in range(2)]
    waiting = [str(uuid.uuid4()) for _ in range(42)]
    idle = "bridge: 0, runninghub: 0"
    await page.wait_for(f"{cell('queues', 'comfyui', 3)} === {idle!r}", within=15)
    await submit(client, held)
    await page.wait_for(f"{BRIDGE_DETAIL}.includes({held[1]!r})")
    await submit(client, waiting)
    await page_through(page)
    await filter_live_tasks(page)
    await cancel_from_the_live_list(env, page)
    await every_panel_fits_and_shows_data(page)
    fleet.release.set()
    async with httpx.AsyncClient(base_url=env.base) as http:
        for task_id in waiting:
            await http.post(f"/api/tasks/{task_id}/cancel", headers=ADMIN_HEADERS)


async def page_through(page: Page) -> None:
    range_text = "document.querySelector('#live-range').textContent"
    first = await page.wait_for(f"/^1–20 of (2[1-9]|[3-9]\\d)$/.test({range_text}) && {range_text}")
    assert await page.eval("document.querySelector('#live-prev').disabled") is True
    await page.eval("document.querySelector('#live-next').click()")
    second = await page.wait_for(f"{range_text}.startsWith('21–') && {range_text}")
    assert await page.eval("document.querySelector('#live-prev').disabled") is False
    await page.screenshot(ARTIFACTS / "08-live-page-2.png")
    await page.eval("document.querySelector('#live-prev').click()")
    await page.wait_for(f"{range_text}.startsWith('1–')")
    assert first != second


async def choose(page: Page, select: str, value: str) -> None:
    """Pick ``value`` in the ``select`` as a person's choice does (a change event)."""
    await page.eval(
        f"(() => {{ const s = document.querySelector({select!r}); s.value = {value!r};"
        " s.dispatchEvent(new Event('change', {bubbles: true})); })()"
    )


async def filter_live_tasks(page: Page) -> None:
    """By target: only RunningHub's; by state: only the queued ones."""
    await page.wait_for(
        "[...document.querySelector('#live-target').options].some(o => o.value === 'runninghub')"
    )
    await choose(page, "#live-target", "runninghub")
    await page.wait_for(
        f"{live_column(3)}.length > 0 && {live_column(3)}.every(w => w.includes('runninghub'))"
    )
    await choose(page, "#live-target", "")
    await choose(page, "#live-state", "pending")
    await page.wait_for(
        f"{live_column(1)}.length === 20 && {live_column(1)}.every(s => s === 'pending')"
    )
    await choose(page, "#live-state", "")


async def cancel_from_the_live_list(env: Env, page: Page) -> None:
    """The Cancel button of a waiting task's row cancels it; it leaves the list."""
    task_id = await page.eval(
        "[...document.querySelectorAll('#live tbody tr')]"
        ".find(r => r.cells[1].textContent === 'pending').cells[0].textContent"
    )
    await page.eval(
        "[...document.querySelectorAll('#live tbody tr')]"
        f".find(r => r.cells[0].textContent === {task_id!r}).querySelector('button').click()"
    )
    await page.wait_for(f"!{live_column(0)}.includes({task_id!r})")
    assert (await env.task(task_id)).state == "cancelled"


async def every_panel_fits_and_shows_data(page: Page) -> None:
    """At a wide and a narrow window: no panel scrolls sideways, the bridges' Drain button
    is inside its panel, no task id breaks across lines, and each panel shows data from
    this run (the latency figures too)."""
    assert re.search(
        r"p50 [\d.]+ s", await page.eval("document.querySelector('#latency').textContent")
    )
    for width in (1400, 900):
        await page.resize(width, 1000)
        shown = int(await page.eval("Number(document.body.dataset.snapshots || 0)"))
        # a fresh snapshot laid out at this width (the count goes up once it is rendered)
        await page.wait_for(f"Number(document.body.dataset.snapshots) > {shown}")
        await page.screenshot(ARTIFACTS / f"07-all-panels-{width}px.png")  # to see what fails
        for section in ("bridges", "live", "recent"):
            shot = ARTIFACTS / f"07-{section}-{width}px.png"
            await page.screenshot(shot, f"section:has(#{section})")
        overflowing = await page.eval(
            "[...document.querySelectorAll('main > section:not([hidden])')]"
            ".filter(s => s.scrollWidth > s.clientWidth + 1)"
            ".map(s => s.querySelector('h2').textContent)"
        )
        assert overflowing == [], (width, overflowing)
        page_width = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        assert await page.eval(page_width), width  # nor does the page
        drain_inside = (
            "(() => { const b = document.querySelector('#bridges tbody button');"
            " const s = b.closest('section');"
            " return b.getBoundingClientRect().right <= s.getBoundingClientRect().right; })()"
        )
        assert await page.eval(drain_inside), width
        broken = await page.eval(
            "[...document.querySelectorAll('.id')].filter(e => e.getClientRects().length > 1)"
            ".map(e => e.textContent)"
        )
        assert broken == [], (width, broken)
        assert await page.eval("document.querySelectorAll('#bridges .id').length") == 2
        for panel, selector in PANELS_WITH_DATA.items():
            assert await page.eval(f"document.querySelectorAll({selector!r}).length"), panel


async def show_spend_and_asynch(page: Page) -> None:
    """Overflow spend counts the tasks RunningHub took (this process: ≥ 2 at 0.25 each,
    plus d1); the model-asynch panel shows its models and recent tasks."""
    # its recorded cost: the price (the emulator reports no money), an estimate
    cost = cell("overflow", "runninghub", 3)
    await page.wait_for(
        f"+{cell('overflow', 'runninghub', 1)} >= 3 && {cost}.startsWith('≈')"
        f" && parseFloat({cost}.slice(1)) >= 0.75"
    )
    assert await page.eval(cell("overflow", "runninghub", 2)) == "0.25"  # its price
    assert "per process" in await page.eval("document.querySelector('#overflow-total').textContent")
    # the fleet's figures, from Redis: RunningHub's tasks at the price, an estimate
    fleet = cell("spend-projects", "proj", 1)
    await page.wait_for(f"{fleet}.startsWith('≈') && parseFloat({fleet}.slice(1)) >= 0.75")
    assert await page.eval("document.querySelector('#asynch-panel').hidden") is False
    await page.wait_for(f"{cell('asynch-models', 'sdxl', 2)} === '3 / 20'")
    assert await page.eval(cell("asynch-models", "sdxl", 3)) == "2 / 2 per tenant"
    assert await page.eval(cell("asynch-recent", "a1", 3)) == "running"
    await page.eval("document.querySelector('#asynch-panel').scrollIntoView()")
    await page.screenshot(ARTIFACTS / "06-overflow-spend-and-asynch.png")
