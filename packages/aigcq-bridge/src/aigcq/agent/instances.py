"""ComfyUI instances: an HTTP + WebSocket client per instance, and the pool that picks one.

Each instance keeps one WebSocket open as the bridge's ``clientId``; execution events are
routed by ``prompt_id`` to whoever :meth:`ComfyInstance.watch`-es that prompt. An instance
found down tells every watcher at once (:data:`INSTANCE_DOWN`), so a prompt that was running
there ends (or moves) now, not when its events have been silent for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from aigcq.wire.bridge import InstanceInfo
from aigcq.wire.capabilities import Needs, offered_by

log = logging.getLogger(__name__)

Event = dict[str, Any]
#: put in every watcher's queue when the instance is found down (not one of ComfyUI's)
INSTANCE_DOWN = "aigcq_instance_down"

#: seconds between attempts to reopen an instance's WebSocket
RECONNECT_S = 0.5
#: finished prompts' history entries deleted by one ``POST /history``, at most
HISTORY_BATCH = 64
#: seconds a finished prompt's history entry waits for its batch, at most
HISTORY_FLUSH_S = 5.0
InstanceState = Literal["idle", "busy", "offline"]


class PromptRejected(Exception):
    """ComfyUI refused the prompt (HTTP 400); the message summarises its errors."""


class InstanceDown(Exception):
    """The instance could not be reached or answered with a server error."""


class InputRefused(Exception):
    """ComfyUI refused an input file (a 4xx to ``/upload/image``: too large, say)."""


@dataclass(frozen=True, slots=True)
class OutputRef:
    """One file in a history entry's ``outputs``."""

    node_id: str
    filename: str
    subfolder: str
    type: str


def history_outputs(entry: dict[str, Any]) -> list[OutputRef]:
    """The saved files (``type: output``) of a ``/history`` entry, in node order."""
    refs = []
    for node_id, output in (entry.get("outputs") or {}).items():
        for items in output.values():
            if not isinstance(items, list):
                continue
            refs += [
                OutputRef(str(node_id), f["filename"], f.get("subfolder", ""), f["type"])
                for f in items
                if isinstance(f, dict) and "filename" in f and f.get("type") == "output"
            ]
    return refs


@dataclass(frozen=True, slots=True)
class PromptError:
    """Why a finished prompt failed: ``infrastructure`` (out of memory, interrupted from
    outside) or the task's own (a node raised on its inputs)."""

    failure_class: Literal["task", "infrastructure"]
    code: str
    message: str


_OOM = ("OutOfMemoryError", "out of memory", "Allocation on device")


def history_error(entry: dict[str, Any]) -> PromptError | None:
    """None for a successful entry, else what went wrong."""
    status = entry.get("status") or {}
    if status.get("status_str") == "success":
        return None
    for name, data in reversed(status.get("messages") or []):
        if name == "execution_error":
            message = (
                f"{data.get('node_type')} (node {data.get('node_id')}): "
                f"{data.get('exception_type')}: {data.get('exception_message')}"
            )
            if any(sign in message for sign in _OOM):
                return PromptError("infrastructure", "OutOfMemory", message)
            return PromptError("task", "NodeError", message)
        if name == "execution_interrupted":
            where = f"{data.get('node_type')} (node {data.get('node_id')})"
            return PromptError("infrastructure", "Interrupted", f"interrupted at {where}")
    return PromptError("infrastructure", "ComfyUIError", "ComfyUI reported an error")


def rejection_summary(body: Any) -> str:
    """One line from a 400 ``/prompt`` answer: the error and each node's errors."""
    if not isinstance(body, dict):
        return f"prompt rejected: {body}"
    error = body.get("error") or {}
    parts = [f"{error.get('type')}: {error.get('message')}"]
    for node_id, node in (body.get("node_errors") or {}).items():
        for e in node.get("errors", []):
            parts.append(
                f"node {node_id} ({node.get('class_type')}): {e.get('message')}: {e.get('details')}"
            )
    return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Device:
    """The torch device an instance runs on, from its ``/system_stats``; VRAM in bytes."""

    name: str
    vram_total: int
    vram_free: int


def device_of(stats: Any) -> Device | None:
    """The first device of a ``/system_stats`` answer (ComfyUI runs on one), if readable."""
    try:
        first = stats["devices"][0]
        return Device(str(first["name"]), int(first["vram_total"]), int(first["vram_free"]))
    except (LookupError, TypeError, ValueError):
        return None


def _numbered(entry: dict[str, Any], number: float | None) -> bool:
    """Whether a history entry is of the prompt queued as ``number`` (None: of any); its
    ``prompt`` is ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``."""
    if number is None:
        return True
    prompt = entry.get("prompt")
    return isinstance(prompt, list) and bool(prompt) and prompt[0] == number


class ComfyInstance:
    """One ComfyUI server."""

    def __init__(self, url: str, http: httpx.AsyncClient, client_id: str, slots: int) -> None:
        self.url = url.rstrip("/")
        self.instance_id = urlsplit(self.url).netloc or self.url
        self.http = http
        self.client_id = client_id
        self.slots = slots
        self.healthy = False
        self.external_load = 0  # queued prompts that are not ours
        self.running: set[str] = set()  # our task ids
        self.offer: Needs | None = None  # from /object_info (None: not known yet)
        self.loaded: frozenset[str] = frozenset()  # model files its last prompt of ours used
        self.device: Device | None = None  # from /system_stats, at each health check
        #: uploaded inputs it has (their hash -> its name for them), forgotten when it goes
        #: down: each input is fetched and uploaded to it once, not for every task
        self.inputs: dict[str, str] = {}
        self.ws_connected = asyncio.Event()
        self._done: list[str] = []  # prompt ids whose history entry is to be deleted
        self._batch_full = asyncio.Event()
        #: when its WebSocket last brought a message but the greeting (monotonic; see
        #: :meth:`deaf_since`)
        self.last_heard = 0.0
        self._ws: ClientConnection | None = None
        #: called when the instance comes back or goes away (the bridge tells aigcq now)
        self.on_change: Callable[[], None] = lambda: None
        self._watchers: dict[str, asyncio.Queue[Event]] = {}

    # -- state --
    @property
    def free_slots(self) -> int:
        return max(self.slots - len(self.running), 0) if self.healthy else 0

    def info(self) -> InstanceInfo:
        state: InstanceState = "offline" if not self.healthy else "busy" if self.running else "idle"
        task = min(self.running) if self.running else None
        offer = self.offer
        return InstanceInfo(
            instance_id=self.instance_id,
            url=self.url,
            state=state,
            task_id=task,
            node_classes=sorted(offer.node_classes) if offer else None,
            models=sorted(offer.models) if offer else None,
            device=self.device.name if self.device else None,
            vram_total=max(self.device.vram_total, 0) if self.device else None,
            vram_free=max(self.device.vram_free, 0) if self.device else None,
            slots=self.slots,
        )

    def can_run(self, needs: Needs | None) -> bool:
        return needs is None or self.offer is None or self.offer.covers(needs)

    # -- health --
    async def check(self) -> bool:
        """``/system_stats`` and ``/queue`` both answer: healthy. Updates ``external_load``
        and ``device`` (its VRAM free changes as models load)."""
        try:
            stats = await self.http.get(f"{self.url}/system_stats", timeout=5.0)
            queue = await self.http.get(f"{self.url}/queue", timeout=5.0)
            stats.raise_for_status()
            queue.raise_for_status()
            q = queue.json()
            load = len(q.get("queue_running", [])) + len(q.get("queue_pending", []))
            self.device = device_of(stats.json())
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            if self.healthy:
                log.warning("instance %s: health check failed: %s", self.instance_id, e)
                self._set_healthy(False)
            return False
        self.external_load = max(load - len(self.running), 0)
        if not self.healthy:
            log.info("instance %s: healthy", self.instance_id)
            await self._learn()
            self._set_healthy(True)
        return True

    async def _learn(self) -> None:
        """What it offers (``/object_info``): read each time it comes (back) up."""
        try:
            resp = await self.http.get(f"{self.url}/object_info", timeout=10.0)
            resp.raise_for_status()
            self.offer = offered_by(resp.json())
        except (httpx.HTTPError, ValueError) as e:
            log.warning("instance %s: /object_info unreadable: %s", self.instance_id, e)
            self.offer = None

    def _set_healthy(self, healthy: bool) -> None:
        self.healthy = healthy
        if not healthy:
            self.inputs.clear()
            for queue in self._watchers.values():
                queue.put_nowait({"type": INSTANCE_DOWN, "data": {}})
        self.on_change()

    # -- events --
    def watch(self, prompt_id: str) -> asyncio.Queue[Event]:
        """Start collecting events for ``prompt_id`` (call before submitting it)."""
        return self._watchers.setdefault(prompt_id, asyncio.Queue())

    def unwatch(self, prompt_id: str) -> None:
        self._watchers.pop(prompt_id, None)

    async def listen(self) -> None:
        """Keep the WebSocket open forever, routing events to watchers. Its opening and
        closing are checked at once: an instance that comes back or goes away is known
        within a second, not at the next periodic check."""
        ws_url = self.url.replace("http", "ws", 1) + f"/ws?clientId={quote(self.client_id)}"
        while True:
            try:
                async with connect(ws_url, max_size=None, open_timeout=5) as ws:
                    self._ws = ws
                    self.ws_connected.set()
                    await self.check()
                    async for raw in ws:
                        if isinstance(raw, str):
                            self._route(raw)
                        else:  # a preview image, sent to our clientId
                            self.last_heard = time.monotonic()
            except (OSError, WebSocketException, TimeoutError) as e:
                log.debug("instance %s: websocket: %s", self.instance_id, e)
            finally:
                self._ws = None
                self.ws_connected.clear()
            await self.check()
            await asyncio.sleep(RECONNECT_S)

    def deaf_since(self, since: float) -> bool:
        """Whether its WebSocket has brought nothing since ``since`` (monotonic), though
        ComfyUI broadcasts ``status`` at every prompt queued: it no longer counts our
        ``clientId`` (ComfyUI forgets a clientId when any socket of it closes, also an
        older one closing after ours connected) and sends our prompts' events to no one."""
        return self._ws is not None and self.last_heard < since

    async def reopen(self) -> None:
        """Close the WebSocket: :meth:`listen` opens it again at once, counted again."""
        ws = self._ws
        if ws is not None:
            log.warning("instance %s: websocket hears nothing; reopening it", self.instance_id)
            await ws.close()

    def _route(self, raw: str) -> None:
        with contextlib.suppress(ValueError, LookupError, TypeError):
            event = json.loads(raw)
            if not (event["type"] == "status" and "sid" in event["data"]):
                self.last_heard = time.monotonic()  # the greeting tells nothing of later
            queue = self._watchers.get(event["data"]["prompt_id"])
            if queue is not None:
                queue.put_nowait(event)

    # -- prompts --
    async def submit(self, prompt: dict[str, Any], prompt_id: str) -> float | None:
        """``POST /prompt``: its number in ComfyUI's queue (None if it names none); raises
        :class:`PromptRejected` or :class:`InstanceDown`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ws_connected.wait(), 2.0)
        body = {"prompt": prompt, "client_id": self.client_id, "prompt_id": prompt_id}
        try:
            resp = await self.http.post(f"{self.url}/prompt", json=body, timeout=30.0)
        except httpx.HTTPError as e:
            raise InstanceDown(f"{self.instance_id}: {e}") from None
        if resp.status_code == 400:
            try:
                answer: Any = resp.json()
            except ValueError:
                answer = resp.text[:500]
            raise PromptRejected(rejection_summary(answer))
        if resp.status_code != 200:
            raise InstanceDown(f"{self.instance_id}: /prompt answered {resp.status_code}")
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            return float(resp.json()["number"])
        return None

    async def history(self, prompt_id: str, number: float | None = None) -> dict[str, Any] | None:
        """The finished prompt's history entry, None while it is not finished or unreachable.
        ``number``: the prompt's in ComfyUI's queue; an entry of another number is an earlier
        prompt of the same id (a task id used again), not this one's: None."""
        try:
            resp = await self.http.get(f"{self.url}/history/{quote(prompt_id, safe='')}")
            resp.raise_for_status()
            entry = resp.json().get(prompt_id)
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            log.debug("instance %s: history %s: %s", self.instance_id, prompt_id, e)
            return None
        if not isinstance(entry, dict) or not _numbered(entry, number):
            return None
        return entry

    def forget(self, prompt_id: str) -> None:
        """The bridge is done with ``prompt_id``'s history entry: it is deleted with the
        next batch (:meth:`forget_loop`)."""
        self._done.append(prompt_id)
        if len(self._done) >= HISTORY_BATCH:
            self._batch_full.set()

    async def forget_loop(self, interval: float = HISTORY_FLUSH_S) -> None:
        """Delete the history entries the bridge is done with: one ``POST /history
        {"delete": [...]}`` for every :data:`HISTORY_BATCH` of them, or every ``interval``
        seconds while some wait (ComfyUI otherwise keeps each prompt's outputs)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batch_full.wait(), interval)
            self._batch_full.clear()
            if self._done:
                await self._delete_history()

    async def _delete_history(self) -> None:
        done, self._done = self._done[:HISTORY_BATCH], self._done[HISTORY_BATCH:]
        try:
            await self.http.post(f"{self.url}/history", json={"delete": done})
        except httpx.HTTPError as e:  # down: restarted, its history gone with it
            log.debug("instance %s: history delete: %s", self.instance_id, e)

    async def queued(self, prompt_id: str, *, waiting: bool = True) -> bool:
        """Whether ``prompt_id`` is running (or, with ``waiting``, waiting) in ``/queue``;
        raises :class:`InstanceDown` when the instance does not answer."""
        try:
            resp = await self.http.get(f"{self.url}/queue", timeout=5.0)
            resp.raise_for_status()
            q = resp.json()
            items = [*q.get("queue_running", []), *(q.get("queue_pending", []) if waiting else [])]
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            raise InstanceDown(f"{self.instance_id}: /queue: {e}") from None
        return any(isinstance(i, list) and len(i) > 1 and i[1] == prompt_id for i in items)

    async def download(self, ref: OutputRef, dest: Path) -> None:
        """Stream ``/view`` for ``ref`` into ``dest``."""
        params = {"filename": ref.filename, "subfolder": ref.subfolder, "type": ref.type}
        tmp = dest.with_suffix(dest.suffix + ".part")
        async with self.http.stream("GET", f"{self.url}/view", params=params) as resp:
            resp.raise_for_status()
            with tmp.open("wb") as f:
                async for chunk in resp.aiter_bytes():
                    f.write(chunk)
        tmp.replace(dest)

    async def upload_input(self, name: str, data: bytes, content_type: str) -> str:
        """``POST /upload/image`` (``type`` input, overwritten: ``name`` names its content):
        the value a loader node takes for it; raises :class:`InputRefused` or
        :class:`InstanceDown`."""
        files = {"image": (name, data, content_type)}
        form = {"type": "input", "overwrite": "true"}
        try:
            resp = await self.http.post(
                f"{self.url}/upload/image", files=files, data=form, timeout=60.0
            )
        except httpx.HTTPError as e:
            raise InstanceDown(f"{self.instance_id}: /upload/image: {e}") from None
        if resp.status_code >= 500:
            raise InstanceDown(f"{self.instance_id}: /upload/image answered {resp.status_code}")
        try:
            answer: Any = resp.json() if resp.status_code == 200 else {}
            stored, folder = str(answer["name"]), str(answer.get("subfolder") or "")
        except (ValueError, TypeError, KeyError, AttributeError):
            raise InputRefused(f"/upload/image answered {resp.status_code}") from None
        return f"{folder}/{stored}" if folder else stored

    async def cancel(self, prompt_id: str) -> None:
        """Remove the prompt from the queue and interrupt it if it is the one running (best
        effort). The interrupt names it, and ComfyUI 0.3.56 and newer stop only that one;
        older versions stop whatever runs, so it is sent only when ``/queue`` shows it
        running (not for a prompt waiting behind someone else's)."""
        with contextlib.suppress(httpx.HTTPError, InstanceDown):
            await self.http.post(f"{self.url}/queue", json={"delete": [prompt_id]})
            if await self.queued(prompt_id, waiting=False):
                await self.http.post(f"{self.url}/interrupt", json={"prompt_id": prompt_id})


class InstancePool:
    """The bridge's instances; counts are in slots (one slot = one running prompt)."""

    def __init__(self, instances: list[ComfyInstance]) -> None:
        self.instances = instances

    def acquire(
        self,
        task_id: str,
        exclude: frozenset[str] = frozenset(),
        needs: Needs | None = None,
        affinity: bool = True,
        wanted: str | None = None,
    ) -> ComfyInstance | None:
        """Reserve a slot on a healthy instance that can run ``needs``, or None if all such
        are full: ``wanted`` (the instance aigcq counted the task on) if it is one; else,
        with ``affinity``, one whose loaded models are the ones needed first (no model
        load), else one whose models are loaded on most other instances; then the least
        busy."""
        free = [
            i
            for i in self.instances
            if i.free_slots and i.instance_id not in exclude and i.can_run(needs)
        ]
        if not free:
            return None
        named = [i for i in free if i.instance_id == wanted]
        if named:
            return self._take(named[0], task_id, needs)
        models = needs.models if needs and affinity else frozenset()
        copies = Counter(i.loaded for i in self.instances) if models else Counter()

        def rank(i: ComfyInstance) -> tuple[bool, int, int, int]:
            # no instance has them loaded: replace what is loaded on the most instances
            # (nothing loaded counts as most), so each model keeps its warm instances
            spare = -len(self.instances) if not i.loaded else -copies[i.loaded]
            warm = bool(models) and models <= i.loaded
            return (not warm, spare if models else 0, len(i.running), i.external_load)

        return self._take(min(free, key=rank), task_id, needs)

    @staticmethod
    def _take(instance: ComfyInstance, task_id: str, needs: Needs | None) -> ComfyInstance:
        instance.running.add(task_id)
        if needs is not None and needs.models:
            instance.loaded = needs.models
        return instance

    def lacks(self, needs: Needs) -> str:
        """What no instance here offers (``""``: some instance can run ``needs``)."""
        known = [i.offer for i in self.instances if i.offer is not None]
        if len(known) < len(self.instances) or any(o.covers(needs) for o in known):
            return ""
        return min((o.missing(needs) for o in known), key=len, default="")

    def by_url(self, url: str) -> ComfyInstance | None:
        return next((i for i in self.instances if i.url == url.rstrip("/")), None)

    @staticmethod
    def release(instance: ComfyInstance, task_id: str) -> None:
        instance.running.discard(task_id)

    def counts(self) -> tuple[int, int, int]:
        """(slots in all, free slots on healthy instances, busy slots)."""
        total = sum(i.slots for i in self.instances)
        free = sum(i.free_slots for i in self.instances)
        busy = sum(len(i.running) for i in self.instances)
        return total, free, busy

    def infos(self) -> list[InstanceInfo]:
        return [i.info() for i in self.instances]

    async def check_all(self) -> None:
        await asyncio.gather(*(i.check() for i in self.instances))

    async def health_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.check_all()
