"""Headless Chromium driven over the DevTools protocol with ``websockets`` (no browser
download, no driver): start it, open a page, evaluate JavaScript, take screenshots."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets

from tests.fakes.waiting import wait_until

FLAGS = [
    "--headless",
    "--remote-debugging-port=0",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]


def find_chromium() -> str | None:
    """``AIGCQ_CHROMIUM`` when set, else ``chromium`` / ``chromium-browser`` on PATH."""
    if configured := os.environ.get("AIGCQ_CHROMIUM"):
        return shutil.which(configured)
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: send commands and read their replies (events are ignored)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send(
            orjson.dumps({"id": msg_id, "method": method, "params": params}).decode()
        )
        while True:
            reply = orjson.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    async def eval(self, expression: str) -> Any:
        """The value of ``expression`` (promises awaited); page errors raise."""
        reply = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, within: float = 10.0) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        return await wait_until(lambda: self.eval(expression), within, 0.1, what=expression)

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def resize(self, width: int, height: int) -> None:
        """Lay the page out as a window ``width`` × ``height`` CSS pixels wide."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip

    async def screenshot(self, path: Path, selector: str | None = None) -> None:
        """The whole page, or only the element ``selector`` matches first."""
        clip: dict[str, Any] = {}
        if selector is not None:
            box = await self.eval(
                f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();"
                " return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height};"
                " })()"
            )
            clip = {"clip": {**box, "scale": 1}}
        shot = await self.send(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, **clip
        )
        await asyncio.to_thread(_save, path, base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium(executable: str, profile: Path) -> AsyncIterator[Page]:
    """Start headless Chromium with a fresh ``profile`` dir and yield a blank page."""
    log = (profile / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = await _devtools_port(profile / "DevToolsActivePort", proc)
        page_ws = await _open_page(port)
        async with websockets.connect(page_ws, max_size=None) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _devtools_port(path: Path, proc: subprocess.Popen[bytes], within: float = 30.0) -> int:
    """Chromium writes its DevTools port to ``DevToolsActivePort`` once it listens."""

    def port() -> int | None:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        return _port_in(path)

    return await wait_until(port, within, 0.1, what="chromium's DevTools port")


def _port_in(path: Path) -> int | None:
    lines = path.read_text().splitlines() if path.exists() else []
    return int(lines[0]) if lines and lines[0].isdigit() else None


def _save(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def _open_page(port: int) -> str:
    """The DevTools WebSocket URL of the browser's first page."""
    async with httpx.AsyncClient(timeout=10) as http:
        targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
    page = next(t for t in targets if t.get("type") == "page")
    return str(page["webSocketDebuggerUrl"])
