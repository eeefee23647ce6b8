"""Following one prompt on its ComfyUI instance: its events, its end, its output files.

The prompt's end comes from ComfyUI's WebSocket events; when they go quiet the prompt is
reconciled with the instance's ``/history`` and ``/queue`` (in neither: lost, a machine's
failure). The instance found down ends the wait at once (its health check tells the
watchers); a prompt followed again after a restart of the bridge is reconciled first (it
may have finished while the bridge was down). The ComfyUI ``prompt_id`` is our taskId
(``<taskId>-<attempt>`` for attempts after the first, so a retry on the same instance never
meets the old attempt's history).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from aigcq.agent.instances import (
    INSTANCE_DOWN,
    ComfyInstance,
    Event,
    InstanceDown,
    history_error,
    history_outputs,
)
from aigcq.wire.bridge import (
    BridgeMessage,
    FailureClass,
    OutputFile,
    TaskEndResult,
    TaskProgressData,
    TaskProgressMessage,
)

_FINAL_EVENTS = frozenset({"execution_success", "execution_error", "execution_interrupted"})
#: the longest wait for a prompt's first event before its socket is checked: ComfyUI
#: broadcasts ``status`` at once when a prompt is queued, so one that heard nothing is deaf
FIRST_EVENT_S = 1.0


class TaskFailed(Exception):
    """The task ends with TASK_END code 1 and this failure (class, code, message)."""

    def __init__(self, failure_class: FailureClass, code: str, message: str) -> None:
        super().__init__(message)
        self.result = TaskEndResult.failed(failure_class, code, message)


def machine_failure(code: str, message: str) -> TaskFailed:
    return TaskFailed("infrastructure", code, message)


def prompt_id_for(task_id: str, attempt: int | None) -> str:
    return task_id if attempt is None or attempt <= 1 else f"{task_id}-{attempt}"


def _is_final(event: Event) -> bool:
    kind = event.get("type")
    return kind in _FINAL_EVENTS or (kind == "executing" and event["data"].get("node") is None)


@dataclass
class RunningTask:
    task_id: str
    prompt_id: str
    instance: ComfyInstance
    attempt: int | None = None
    started: float = field(default_factory=time.monotonic)
    progress: dict[str, Any] = field(default_factory=dict)
    #: node id -> its name, for progress (see :func:`aigcq.agent.workflow.node_names`)
    node_names: dict[str, str] = field(default_factory=dict)
    last_progress_sent: float = 0.0
    job: asyncio.Task[Any] | None = None  # the handler running it
    cancelled: bool = False  # by the hub (TASK_CANCEL): no TASK_END
    sending: bool = False  # its POST /prompt is out: ComfyUI may queue it yet
    let_go: bool = False  # its instance is free again (its files may still be fetched)
    reopened: bool = False  # its instance's WebSocket, found deaf while it ran
    #: its number in ComfyUI's queue (None: not known, e.g. re-adopted): a history entry
    #: of its id with another number is an earlier prompt's
    number: float | None = None
    #: told each of its ComfyUI events (its trace's span, :mod:`aigcq.agent.traced`)
    on_event: Callable[[Event], None] | None = None

    @property
    def started_at(self) -> float:
        """When it started (epoch s), as its held prompt keeps it across restarts."""
        return time.time() - (time.monotonic() - self.started)


@dataclass(frozen=True)
class RunnerSettings:
    ws_silence: float = 5.0
    task_timeout: float = 3600.0
    progress_interval: float = 0.5
    affinity: bool = True  # prefer the instance whose loaded models a task needs


@dataclass(eq=False)
class Follower:
    send: Callable[[BridgeMessage], Awaitable[bool]]
    files_dir: Path
    #: the signed fileUrl of (taskId, file name) in ``files_dir``
    file_url: Callable[[str, str], str]
    settings: RunnerSettings
    #: called when ComfyUI says the prompt ended (its instance takes the next one while
    #: the history entry is read)
    ended: Callable[[RunningTask], None] = lambda task: None

    async def follow(
        self, task: RunningTask, events: asyncio.Queue[Event], *, look_first: bool = False
    ) -> dict[str, Any]:
        """Wait for the prompt's end from WS events, polling /history when they go quiet
        or the instance is found down (and at once with ``look_first``)."""
        instance = task.instance
        deadline = time.monotonic() + self.settings.task_timeout
        wait = min(self.settings.ws_silence, FIRST_EVENT_S)
        while time.monotonic() < deadline:
            event = None if look_first else await self._next(events, wait)
            silent, look_first, wait = (
                event is None and not look_first,
                False,
                self.settings.ws_silence,
            )
            if event is not None and task.on_event is not None:
                task.on_event(event)
            if event is not None and event.get("type") == "progress":
                await self._progress(task, event["data"])
            if event is not None and not _is_final(event):
                continue
            if not instance.healthy:
                raise InstanceDown("lost while running the prompt")
            if event is not None:
                self.ended(task)
            if silent and not task.reopened and instance.deaf_since(task.started):
                task.reopened = True  # once: a long node may send nothing
                await instance.reopen()  # its events go to no one: be counted again
            entry = await self._reconcile(task)
            if entry is not None:
                error = history_error(entry)
                if error:
                    raise TaskFailed(error.failure_class, error.code, error.message)
                return entry
        await instance.cancel(task.prompt_id)
        timeout = self.settings.task_timeout
        raise machine_failure("Timeout", f"ComfyUI did not finish within {timeout:.0f}s")

    @staticmethod
    async def _next(events: asyncio.Queue[Event], wait: float) -> Event | None:
        """The next event; None after ``wait`` seconds without one, or when the instance
        was found down (reconcile now)."""
        try:
            event = await asyncio.wait_for(events.get(), wait)
        except TimeoutError:
            return None
        return None if event.get("type") == INSTANCE_DOWN else event

    @staticmethod
    async def _reconcile(task: RunningTask) -> dict[str, Any] | None:
        """The prompt's history entry once it finished; ``None`` while it is queued or
        running. In neither (deleted from the queue, the instance restarted): lost."""
        instance = task.instance
        entry = await instance.history(task.prompt_id, task.number)
        if entry is not None or await instance.queued(task.prompt_id):
            return entry
        entry = await instance.history(task.prompt_id, task.number)  # it may have just ended
        if entry is None:
            where = instance.instance_id
            raise machine_failure("PromptLost", f"prompt {task.prompt_id} vanished from {where}")
        return entry

    async def _progress(self, task: RunningTask, data: dict[str, Any]) -> None:
        task.progress = {
            "value": data.get("value"),
            "max": data.get("max"),
            "node": data.get("node"),
        }
        now = time.monotonic()
        if now - task.last_progress_sent < self.settings.progress_interval:
            return
        task.last_progress_sent = now
        node = str(data["node"]) if data.get("node") is not None else None
        msg = TaskProgressData(
            task_id=task.task_id,
            value=int(data.get("value", 0)),
            max=int(data.get("max", 0)),
            node=node,
            node_name=task.node_names.get(node) if node is not None else None,
        )
        await self.send(TaskProgressMessage(data=msg))

    async def collect(self, task: RunningTask, entry: dict[str, Any]) -> list[OutputFile]:
        """Download every output file and return its public fileUrl."""
        folder_name = quote(task.task_id, safe="")
        folder = self.files_dir / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        cost = int(time.monotonic() - task.started)
        files, used = [], set()
        for ref in history_outputs(entry):
            name = PurePosixPath(ref.filename).name
            name = name if name not in used else f"{ref.node_id}_{name}"
            used.add(name)
            try:
                await task.instance.download(ref, folder / name)
            except (httpx.HTTPError, OSError) as e:
                message = f"could not fetch output {ref.filename}: {e}"
                raise machine_failure("OutputUnavailable", message) from None
            url = self.file_url(task.task_id, name)
            file_type = PurePosixPath(name).suffix.lstrip(".").lower()
            files.append(
                OutputFile(
                    file_url=url, file_type=file_type, task_cost_time=cost, node_id=ref.node_id
                )
            )
        return files
