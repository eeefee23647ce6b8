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
