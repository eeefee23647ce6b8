"""The bridge's spool writes its files off the event loop (issue 42 item 14): a slow disk's
fsync stalls no other task of the bridge, and a result is on disk before its TASK_END is
sent."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import time
from pathlib import Path

import httpx
import pytest

from aigcq.agent import spool as spool_module
from aigcq.agent.spool import Spool, SpooledResult, WebhookSender
from aigcq.wire.bridge import TaskEndBody, TaskEndResult
from tests.fakes.servers import Recorder, serve_app

FSYNC_S = 0.4  # a loaded disk's fsync


async def test_a_slow_fsync_leaves_the_event_loop_free_and_comes_before_the_task_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[float] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        real_fsync(fd)
        time.sleep(FSYNC_S)
        synced.append(time.monotonic())

    monkeypatch.setattr(os, "fsync", slow_fsync)
    ticks: list[float] = []

    async def ticking() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    recorder = Recorder()
    async with serve_app(recorder.app) as hub, httpx.AsyncClient() as http:
        spool = Spool(tmp_path / "spool")
        sender = WebhookSender(http, spool)
        ticker = asyncio.create_task(ticking())
        await asyncio.sleep(0.05)
        body = TaskEndBody.build("t1", TaskEndResult(code=0, msg="success"))
        sent = sender.send(SpooledResult(f"{hub}/callback/t1", body))
        if inspect.isawaitable(sent):
            await sent
        assert synced and "t1" in spool  # on disk, fsynced, when send returns
        [received] = await recorder.wait_for(1)
        ticker.cancel()
        await sender.close()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < FSYNC_S / 2, max(gaps)  # the loop ran on while the disk worked
    assert received.path == "/callback/t1"


async def test_a_result_readdressed_while_a_try_is_out_is_sent_to_the_new_address_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer attempt takes over a finished task's undelivered TASK_END while a try of it
    is out: that try fails, and the next goes to the newer attempt's address at once, not
    after the try's back-off (which a hub away for long makes up to a minute: was lost, the
    readdress's wake came while the try was out)."""
    monkeypatch.setattr(spool_module, "retry_delay", lambda *_: 3600.0)  # a long back-off
    held, release = asyncio.Event(), asyncio.Event()
    recorder = Recorder()

    async def old_address(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["path"] == "/old":
            held.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await recorder.app(scope, receive, send)

    async with serve_app(old_address) as hub, httpx.AsyncClient() as http:
        sender = WebhookSender(http, Spool(tmp_path / "spool"))
        body = TaskEndBody.build("t1", TaskEndResult(code=0, msg="success"))
        await sender.send(SpooledResult(f"{hub}/old", body))
        await asyncio.wait_for(held.wait(), 10)
        await sender.readdress("t1", f"{hub}/new")  # while the try to /old is out
        release.set()
        [received] = await recorder.wait_for(1, within=10)
        assert received.path == "/new"
        await sender.close()
