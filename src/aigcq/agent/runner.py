"""One TASK_ASSIGN from start to TASK_END: ACK, workflow, ComfyUI, files, result.

The ComfyUI ``prompt_id`` is our taskId (``<taskId>-<attempt>`` for attempts after the
first, so a retry on the same instance never meets the old attempt's history).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from aigcq.agent.held import HeldPrompt, HeldPrompts
from aigcq.agent.instances import (
    ComfyInstance,
    Event,
    InstanceDown,
    InstancePool,
    PromptRejected,
    history_error,
    history_outputs,
)
from aigcq.agent.spool import SpooledResult, WebhookSender
from aigcq.agent.workflow import (
    Workflow,
    WorkflowError,
    WorkflowNotFound,
    WorkflowSource,
    apply_node_info,
)
from aigcq.bridges.protocol import (
    ACK_NO_CAPACITY,
    ACK_OK,
    ACK_WORKFLOW_NOT_FOUND,
    AckBody,
    BridgeMessage,
    FailureClass,
    OutputFile,
    TaskAckData,
    TaskAckMessage,
    TaskAssignData,
    TaskCancelData,
    TaskEndBody,
    TaskEndResult,
    TaskProgressData,
    TaskProgressMessage,
)
from aigcq.observability.jsonlog import ctx

log = logging.getLogger(__name__)

_FINAL_EVENTS = frozenset({"execution_success", "execution_error", "execution_interrupted"})


class TaskFailed(Exception):
    """The task ends with TASK_END code 1 and this failure (class, code, message)."""

    def __init__(self, failure_class: FailureClass, code: str, message: str) -> None:
        super().__init__(message)
        self.result = TaskEndResult.failed(failure_class, code, message)


def _machine(code: str, message: str) -> TaskFailed:
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
    last_progress_sent: float = 0.0
    job: asyncio.Task[Any] | None = None  # the handler running it
    cancelled: bool = False  # by the hub (TASK_CANCEL): no TASK_END


@dataclass(frozen=True)
class RunnerSettings:
    ws_silence: float = 5.0
    task_timeout: float = 3600.0
    progress_interval: float = 0.5


class TaskRunner:
    """Runs assignments; ``running`` and ``claimed`` feed the status page and REGISTER."""

    def __init__(
        self,
        pool: InstancePool,
        source: WorkflowSource,
        sender: WebhookSender,
        send: Callable[[BridgeMessage], Awaitable[bool]],
        files_dir: Path,
        public_url: Callable[[], str],
        settings: RunnerSettings,
    ) -> None:
        self.pool = pool
        self.source = source
        self.sender = sender
        self.send = send
        self.files_dir = files_dir
        self.public_url = public_url
        self.settings = settings
        self.claimed: set[str] = set()  # accepted, no result yet
        self.running: dict[str, RunningTask] = {}
        self.prompts = HeldPrompts(files_dir.parent / "held")

    def held(self) -> list[str]:
        """Task ids this bridge holds: in progress or with an undelivered result."""
        return sorted(self.claimed | set(self.sender.spool.task_ids()))

    async def handle(self, assign: TaskAssignData) -> None:
        """Answer one TASK_ASSIGN and, if taken, run it to its TASK_END."""
        task_id = assign.task_id or uuid.uuid4().hex  # a seed hub sends no taskId
        if task_id in self.claimed or task_id in self.sender.spool:
            log.info(
                "task %s: assigned again while held; ACK only", task_id, extra=ctx(task=task_id)
            )
            await self._ack(task_id, assign.attempt)
            return
        self.claimed.add(task_id)
        try:
            await self._take(task_id, assign)
            self.prompts.remove(task_id)  # ended (not stopped by a shutdown): nothing to adopt
        finally:
            self.claimed.discard(task_id)

    def held_prompts(self) -> list[HeldPrompt]:
        """The prompts a previous run of this bridge left unfinished, claimed now (so
        REGISTER lists them); follow each with :meth:`readopt`."""
        found = self.prompts.load_all()
        self.claimed.update(h.task_id for h in found)
        return found

    async def readopt(self, held: HeldPrompt) -> None:
        """Follow a prompt a previous run submitted to its end and send its TASK_END."""
        task_id = held.task_id
        try:
            instance = self.pool.by_url(held.instance_url)
            if instance is None:
                where = held.instance_url
                result = _machine("InstanceLost", f"instance {where} is no longer configured")
                self._finish(task_id, held.assign.webhook_url, result.result)
            else:
                instance.running.add(task_id)
                task = RunningTask(task_id, held.prompt_id, instance, held.assign.attempt)
                log.info(
                    "task %s: re-adopted prompt %s on %s",
                    task_id,
                    held.prompt_id,
                    instance.instance_id,
                    extra=ctx(task=task_id),
                )
                await self._drive(task, held.assign.webhook_url, self._resume(task))
            self.prompts.remove(task_id)
        finally:
            self.claimed.discard(task_id)

    async def _resume(self, task: RunningTask) -> dict[str, Any]:
        events = task.instance.watch(task.prompt_id)
        try:
            return await self._follow(task, events)
        except InstanceDown as e:
            raise _machine("InstanceLost", f"{task.instance.instance_id}: {e}") from None
        finally:
            task.instance.unwatch(task.prompt_id)

    async def _take(self, task_id: str, assign: TaskAssignData) -> None:
        try:
            workflow = apply_node_info(await self.source.resolve(assign), assign.node_info_list)
        except WorkflowNotFound as e:
            await self._ack(task_id, assign.attempt, ACK_WORKFLOW_NOT_FOUND, str(e))
            return
        except WorkflowError as e:
            await self._ack(task_id, assign.attempt)
            result = TaskEndResult.failed("task", "InvalidWorkflow", str(e))
            self._finish(task_id, assign.webhook_url, result)
            return
        instance = self.pool.acquire(task_id)
        if instance is None:
            await self._ack(task_id, assign.attempt, ACK_NO_CAPACITY, "no free ComfyUI instance")
            return
        await self._ack(task_id, assign.attempt)
        prompt_id = prompt_id_for(task_id, assign.attempt)
        task = RunningTask(task_id, prompt_id, instance, assign.attempt)
        await self._drive(task, assign.webhook_url, self._execute(task, workflow, assign))

    async def _drive(
        self, task: RunningTask, webhook_url: str, run: Coroutine[Any, Any, dict[str, Any]]
    ) -> None:
        """Run ``task`` (``run`` gives its history entry), then its TASK_END; none when the
        hub cancelled it."""
        task.job = asyncio.current_task()
        self.running[task.task_id] = task
        try:
            result = await self._outcome(task, run)
        except asyncio.CancelledError:
            if not task.cancelled:
                raise
            return  # the hub no longer wants it: no TASK_END
        finally:
            self.running.pop(task.task_id, None)
            self.pool.release(task.instance, task.task_id)
        self._finish(task.task_id, webhook_url, result)

    async def cancel(self, order: TaskCancelData) -> None:
        """TASK_CANCEL: stop the prompt on its instance (interrupt it only if that
        instance runs it, else delete it from its queue), free the slot, no TASK_END."""
        task = self.running.get(order.task_id)
        if task is None or order.attempt not in (None, task.attempt):
            log.info(
                "task %s: TASK_CANCEL for a task not running here",
                order.task_id,
                extra=ctx(task=order.task_id),
            )
            return
        task.cancelled = True
        await task.instance.cancel(task.prompt_id)
        if task.job is not None:
            task.job.cancel()
        log.info(
            "task %s: cancelled on %s",
            task.task_id,
            task.instance.instance_id,
            extra=ctx(task=task.task_id),
        )

    async def _ack(
        self, task_id: str, attempt: int | None, code: int = ACK_OK, msg: str = "success"
    ) -> None:
        status = "RUNNING" if code == ACK_OK else "REJECTED"
        body = AckBody(task_id=task_id, task_status=status, attempt=attempt)
        sent = await self.send(TaskAckMessage(data=TaskAckData(code=code, msg=msg, data=body)))
        log.info(
            "task %s: TASK_ACK code %d%s",
            task_id,
            code,
            "" if sent else " (not connected)",
            extra=ctx(task=task_id),
        )

    def _finish(self, task_id: str, webhook_url: str, result: TaskEndResult) -> None:
        log.info(
            "task %s: finished, code %d: %s",
            task_id,
            result.code,
            result.msg,
            extra=ctx(task=task_id),
        )
        self.sender.send(SpooledResult(webhook_url, TaskEndBody.build(task_id, result)))

    async def _outcome(
        self, task: RunningTask, run: Coroutine[Any, Any, dict[str, Any]]
    ) -> TaskEndResult:
        try:
            entry = await run
            files = await self._collect(task, entry)
        except TaskFailed as e:
            return e.result
        except PromptRejected as e:  # ComfyUI's validation: the workflow's fault
            return TaskEndResult.failed("task", "PromptValidation", str(e))
        except Exception as e:  # a bridge bug must still end the task
            log.exception("task %s: unexpected error", task.task_id, extra=ctx(task=task.task_id))
            return _machine("BridgeError", f"bridge error: {type(e).__name__}: {e}").result
        return TaskEndResult(code=0, msg="success", data=files)

    async def _execute(
        self, task: RunningTask, workflow: Workflow, assign: TaskAssignData
    ) -> dict[str, Any]:
        """Run the prompt, moving to another free instance while instances are down; none
        free: a machine's failure, the hub retries the task elsewhere."""
        tried: set[str] = set()
        while True:
            try:
                return await self._run_on(task, workflow, assign)
            except InstanceDown as e:
                log.warning(
                    "task %s: instance %s down: %s",
                    task.task_id,
                    task.instance.instance_id,
                    e,
                    extra=ctx(task=task.task_id),
                )
                task.instance.healthy = False
                tried.add(task.instance.instance_id)
                self.pool.release(task.instance, task.task_id)
                other = self.pool.acquire(task.task_id, frozenset(tried))
                if other is None:
                    raise _machine("InstanceLost", f"no ComfyUI instance free ({e})") from None
                task.instance = other

    async def _run_on(
        self, task: RunningTask, workflow: Workflow, assign: TaskAssignData
    ) -> dict[str, Any]:
        instance = task.instance
        events = instance.watch(task.prompt_id)
        try:
            await instance.submit(workflow, task.prompt_id)
            self.prompts.put(HeldPrompt(assign, task.prompt_id, instance.url))
            log.info(
                "task %s: submitted to %s as %s",
                task.task_id,
                instance.instance_id,
                task.prompt_id,
                extra=ctx(task=task.task_id),
            )
            return await self._follow(task, events)
        finally:
            instance.unwatch(task.prompt_id)

    async def _follow(self, task: RunningTask, events: asyncio.Queue[Event]) -> dict[str, Any]:
        """Wait for the prompt's end from WS events, polling /history when they go quiet."""
        instance = task.instance
        deadline = time.monotonic() + self.settings.task_timeout
        while time.monotonic() < deadline:
            try:
                event: Event | None = await asyncio.wait_for(events.get(), self.settings.ws_silence)
            except TimeoutError:
                event = None
            if event is not None and event.get("type") == "progress":
                await self._progress(task, event["data"])
            if event is not None and not _is_final(event):
                continue
            if not instance.healthy:
                raise InstanceDown("lost while running the prompt")
            entry = await self._reconcile(task)
            if entry is not None:
                error = history_error(entry)
                if error:
                    raise TaskFailed(error.failure_class, error.code, error.message)
                return entry
        await instance.cancel(task.prompt_id)
        timeout = self.settings.task_timeout
        raise _machine("Timeout", f"ComfyUI did not finish within {timeout:.0f}s")

    @staticmethod
    async def _reconcile(task: RunningTask) -> dict[str, Any] | None:
        """The prompt's history entry once it finished; ``None`` while it is queued or
        running. In neither (deleted from the queue, the instance restarted): lost."""
        instance = task.instance
        entry = await instance.history(task.prompt_id)
        if entry is not None or await instance.queued(task.prompt_id):
            return entry
        entry = await instance.history(task.prompt_id)  # it may have just finished
        if entry is None:
            where = instance.instance_id
            raise _machine("PromptLost", f"prompt {task.prompt_id} vanished from {where}")
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
        node = data.get("node")
        msg = TaskProgressData(
            task_id=task.task_id,
            value=int(data.get("value", 0)),
            max=int(data.get("max", 0)),
            node=str(node) if node is not None else None,
        )
        await self.send(TaskProgressMessage(data=msg))

    async def _collect(self, task: RunningTask, entry: dict[str, Any]) -> list[OutputFile]:
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
                raise _machine("OutputUnavailable", message) from None
            url = f"{self.public_url()}/files/{folder_name}/{quote(name)}"
            file_type = PurePosixPath(name).suffix.lstrip(".").lower()
            files.append(
                OutputFile(
                    file_url=url, file_type=file_type, task_cost_time=cost, node_id=ref.node_id
                )
            )
        return files
