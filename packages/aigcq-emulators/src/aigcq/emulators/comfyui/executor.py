"""The queue, history, sockets and the single worker of one emulated ComfyUI."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket

from aigcq.emulators.comfyui.config import ComfyUIConfig
from aigcq.emulators.comfyui.graph import (
    PromptRejected,
    ValidPrompt,
    ancestors,
    signature,
    validate_prompt,
)
from aigcq.emulators.comfyui.nodes import NodeContext, NodeFailure, node_table

log = logging.getLogger(__name__)

HISTORY_LIMIT = 10000


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(order=True)
class QueueItem:
    number: float
    prompt_id: str = field(compare=False)
    prompt: dict[str, Any] = field(compare=False)
    extra_data: dict[str, Any] = field(compare=False)
    valid: ValidPrompt = field(compare=False)
    interrupted: bool = field(default=False, compare=False)
    forgotten: bool = field(default=False, compare=False)  # its server "restarted"
    #: node id -> its ``progress_state`` entry (see :meth:`ComfyUIEmulator._node_state`)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    @property
    def client_id(self) -> str | None:
        cid = self.extra_data.get("client_id")
        return str(cid) if cid else None

    def as_list(self) -> list[Any]:
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.valid.outputs]


class Interrupted(Exception):
    pass


class ComfyUIEmulator:
    """Queue, history, sockets and the single worker of one emulated ComfyUI."""

    def __init__(self, config: ComfyUIConfig) -> None:
        self.config = config
        self.nodes = node_table(config.node_classes, config.checkpoints)
        self.pending: list[QueueItem] = []
        self.running: QueueItem | None = None
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.uploads: list[str] = []  # the names /upload/image stored, in order
        self.history_posts = 0  # POST /history calls (clear or delete), as asked
        self.sockets: dict[str, WebSocket] = {}
        self._number = 0
        self._wake = asyncio.Event()
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._rng = random.Random(config.seed)

    # -- sockets --
    async def send(self, event: str, data: dict[str, Any], sid: str | None = None) -> None:
        """Send to ``sid``'s socket, or to every socket when ``sid`` is None."""
        targets = [self.sockets[sid]] if sid in self.sockets else []
        if sid is None:
            targets = list(self.sockets.values())
        for ws in targets:
            with contextlib.suppress(Exception):
                await ws.send_json({"type": event, "data": data})

    def queue_remaining(self) -> int:
        return len(self.pending) + (self.running is not None)

    def status(self) -> dict[str, Any]:
        return {"status": {"exec_info": {"queue_remaining": self.queue_remaining()}}}

    async def broadcast_status(self) -> None:
        await self.send("status", self.status())

    # -- queue --
    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        if "prompt" not in body:
            raise PromptRejected("no_prompt", "No prompt provided", "No prompt provided")
        valid = validate_prompt(body["prompt"], self.nodes)
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        number: float = self._number
        if "number" in body:
            number = float(body["number"])
        elif body.get("front"):
            number = -number
        self._number += 1
        extra = dict(body.get("extra_data") or {})
        if body.get("client_id"):
            extra["client_id"] = body["client_id"]
        extra.setdefault("create_time", _now_ms())
        bisect.insort(self.pending, QueueItem(number, prompt_id, body["prompt"], extra, valid))
        self._wake.set()
        await self.broadcast_status()
        return {"prompt_id": prompt_id, "number": number, "node_errors": valid.node_errors}

    async def delete_pending(self, prompt_ids: list[str] | None) -> None:
        """Drop the given pending prompts (all of them when ``prompt_ids`` is None)."""
        self.pending = [i for i in self.pending if prompt_ids and i.prompt_id not in prompt_ids]
        await self.broadcast_status()

    def interrupt(self, prompt_id: str | None) -> None:
        """Stop the running prompt (if it is ``prompt_id``): at its next step, after
        ``interrupt_latency`` seconds; meanwhile it still runs and is still in ``/queue``.
        With ``global_interrupt``, whatever runs, as older ComfyUI versions do."""
        item = self.running
        if self.config.global_interrupt:
            prompt_id = None
        if item is None or prompt_id not in (None, item.prompt_id):
            return
        latency = self.config.interrupt_latency
        if latency <= 0:
            item.interrupted = True
        else:
            asyncio.get_running_loop().call_later(latency, setattr, item, "interrupted", True)

    async def restart(self) -> None:
        """As if the ComfyUI process restarted: its queue, history and the running prompt
        are forgotten (no events, no history entry for it)."""
        self.pending = []
        self.history.clear()
        if self.running is not None:
            self.running.interrupted = self.running.forgotten = True
        await self.broadcast_status()

    def _take_failure(self) -> bool:
        if self.config.fail_next > 0:
            self.config.fail_next -= 1
            return True
        return self._rng.random() < self.config.fail_rate

    async def worker(self) -> None:
        """Run queued prompts one at a time, forever."""
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.running = self.pending.pop(0)
            gpu = self.config.gpu
            started, gpu.running_since = time.monotonic(), time.time()
            try:
                await self._run(self.running)
            finally:
                self.running = None
                gpu.busy_s += time.monotonic() - started
                gpu.spans.append((gpu.running_since, time.time()))
                gpu.running_since = None
            await self.broadcast_status()

    # -- execution --
    async def _run(self, item: QueueItem) -> None:
        pid, sid = item.prompt_id, item.client_id
        messages: list[list[Any]] = []

        async def event(name: str, data: dict[str, Any], broadcast: bool = False) -> None:
            data = {"prompt_id": pid, **data, "timestamp": _now_ms()}
            messages.append([name, data])
            if sid is not None or broadcast:
                await self.send(name, data, sid)

        order = [n for out in item.valid.outputs for n in ancestors(item.prompt, out)]
        order = list(dict.fromkeys(order))
        memo: dict[str, str] = {}
        signatures = {n: signature(item.prompt, n, memo) for n in order}
        cached = [n for n in order if signatures[n] in self._cache]
        await event("execution_start", {})
        await event("execution_cached", {"nodes": cached})
        fail_at = order[-1] if self._take_failure() else None
        results: dict[str, tuple[Any, ...]] = {n: self._cache[signatures[n]] for n in cached}
        ui: dict[str, Any] = {}
        current = ""
        try:
            for current in order:
                if current not in results:
                    results[current] = await self._node(
                        item, current, results, ui, current == fail_at
                    )
        except Interrupted:
            if item.forgotten:
                return
            node_type = item.prompt[current]["class_type"]
            info = {"node_id": current, "node_type": node_type, "executed": list(results)}
            await event("execution_interrupted", info, broadcast=True)
        except Exception as e:
            log.info("comfyui emulator: prompt %s failed at node %s: %s", pid, current, e)
            await event("execution_error", self._error_data(item, current, list(results), e))
        else:
            await event("execution_success", {})
        self._cache = {signatures[n]: results[n] for n in results if results[n]}
        self._record(item, ui, messages)
        await self.send("executing", {"node": None, "prompt_id": pid}, sid)

    async def _node(
        self,
        item: QueueItem,
        node_id: str,
        results: dict[str, tuple[Any, ...]],
        ui: dict[str, Any],
        fail: bool,
    ) -> tuple[Any, ...]:
        pid, sid = item.prompt_id, item.client_id
        await self._node_state(item, node_id, 0, 1, "running")
        await self.send(
            "executing", {"node": node_id, "display_node": node_id, "prompt_id": pid}, sid
        )
        steps = max(self.config.steps, 1)
        for value in range(1, steps + 1):
            await asyncio.sleep(self.config.step_time)
            if item.interrupted:
                raise Interrupted
            progress = {"value": value, "max": steps, "prompt_id": pid, "node": node_id}
            await self.send("progress", progress, sid)
            await self._node_state(item, node_id, value, steps, "running")
        if fail:
            raise NodeFailure("Injected failure (comfyui emulator)")
        inputs = {
            k: results[str(v[0])][v[1]] if isinstance(v, list) else v
            for k, v in item.valid.inputs[node_id].items()
        }
        spec = self.nodes[item.prompt[node_id]["class_type"]]
        ctx = NodeContext(self.config, item.prompt)
        outputs, node_ui = await asyncio.to_thread(spec.run, ctx, inputs)
        if node_ui is not None:
            ui[node_id] = node_ui
            executed = {
                "node": node_id,
                "display_node": node_id,
                "output": node_ui,
                "prompt_id": pid,
            }
            await self.send("executed", executed, sid)
        await self._node_state(item, node_id, steps, steps, "finished")
        return outputs

    async def _node_state(
        self, item: QueueItem, node_id: str, value: int, steps: int, state: str
    ) -> None:
        """``progress_state``, as ComfyUI 0.3.4x and newer send it at each node's start,
        progress and end: every node of the prompt seen so far, with its state."""
        pid = item.prompt_id
        item.progress[node_id] = {
            "value": float(value),
            "max": float(steps),
            "state": state,
            "node_id": node_id,
            "prompt_id": pid,
            "display_node_id": node_id,
            "parent_node_id": None,
            "real_node_id": node_id,
        }
        nodes = {n: dict(entry) for n, entry in item.progress.items()}
        await self.send("progress_state", {"prompt_id": pid, "nodes": nodes}, item.client_id)

    @staticmethod
    def _error_data(
        item: QueueItem, node_id: str, executed: list[str], e: Exception
    ) -> dict[str, Any]:
        return {
            "node_id": node_id,
            "node_type": item.prompt[node_id]["class_type"],
            "executed": executed,
            "exception_message": str(e),
            "exception_type": type(e).__name__,
            "traceback": [f'  File "nodes.py", in {item.prompt[node_id]["class_type"]}\n'],
            "current_inputs": {},
            "current_outputs": {},
        }

    def _record(self, item: QueueItem, ui: dict[str, Any], messages: list[list[Any]]) -> None:
        ok = messages[-1][0] == "execution_success"
        self.history[item.prompt_id] = {
            "prompt": item.as_list(),
            "outputs": ui,
            "status": {
                "status_str": "success" if ok else "error",
                "completed": ok,
                "messages": messages,
            },
            "meta": {
                n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n}
                for n in ui
            },
        }
        while len(self.history) > HISTORY_LIMIT:
            self.history.popitem(last=False)
