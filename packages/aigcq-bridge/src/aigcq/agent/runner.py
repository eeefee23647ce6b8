"""One TASK_ASSIGN from start to TASK_END: ACK, workflow, ComfyUI, files, result; a
TASK_CANCEL; prompts a previous run left unfinished, re-adopted. Following the prompt on
its instance is :mod:`.following`'s.

The bridge never acknowledges an attempt it will not run. A TASK_ASSIGN for a task it holds
under an older attempt (the hub lost track of it) is taken over by the newer attempt: the
running prompt, or its undelivered result, is now that attempt's (its TASK_ACK, its
TASK_END to its webhook), with no second run; an undelivered machine failure is dropped and
the task run again; a task being stopped after a TASK_CANCEL is refused (421).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aigcq.agent.following import (
    Follower,
    RunnerSettings,
    RunningTask,
    TaskFailed,
    machine_failure,
    prompt_id_for,
)
from aigcq.agent.held import HeldPrompt, HeldPrompts
from aigcq.agent.inputs import place_inputs
from aigcq.agent.instances import (
    InstanceDown,
    InstancePool,
    PromptRejected,
)
from aigcq.agent.spool import SpooledResult, WebhookSender
from aigcq.agent.traced import ended, run_span
from aigcq.agent.workflow import (
    Workflow,
    WorkflowError,
    WorkflowNotFound,
    WorkflowSource,
    apply_node_info,
    node_names,
)
from aigcq.observability.jsonlog import ctx
from aigcq.wire.bridge import (
    ACK_NO_CAPACITY,
    ACK_OK,
    ACK_WORKFLOW_NOT_FOUND,
    AckBody,
    BridgeMessage,
    TaskAckData,
    TaskAckMessage,
    TaskAssignData,
    TaskCancelData,
    TaskEndBody,
    TaskEndResult,
)
from aigcq.wire.capabilities import needs_of

log = logging.getLogger(__name__)

_FINAL_EVENTS = frozenset({"execution_success", "execution_error", "execution_interrupted"})
#: how long a cancel waits for ComfyUI to let the prompt go, and how often it looks
STOP_WAIT_S = 10.0
STOP_POLL_S = 0.05


@dataclass(eq=False)
class TaskRunner:
    """Runs assignments; ``running`` and ``claimed`` feed the status page and REGISTER."""

    pool: InstancePool
    source: WorkflowSource
    sender: WebhookSender
    send: Callable[[BridgeMessage], Awaitable[bool]]
    files_dir: Path
    file_url: Callable[[str, str], str]
    settings: RunnerSettings
    #: the latest assignment of each task accepted here with no result yet
    claimed: dict[str, TaskAssignData] = field(init=False, default_factory=dict)
    #: claimed tasks whose latest attempt has been acknowledged (or listed in REGISTER)
    answered: set[str] = field(init=False, default_factory=set)
    running: dict[str, RunningTask] = field(init=False, default_factory=dict)
    follow: Follower = field(init=False)
    prompts: HeldPrompts = field(init=False)
    #: cancelled by the hub before their prompt started (a workflow being fetched)
    stopped: set[str] = field(init=False, default_factory=set)
    #: called when an instance's slot is released (the bridge sends CAPACITY)
    on_free: Callable[[], None] = field(init=False, default=lambda: None)

    def __post_init__(self) -> None:
        self.follow = Follower(
            self.send, self.files_dir, self.file_url, self.settings, ended=self._let_go
        )
        self.prompts = HeldPrompts(self.files_dir.parent / "held")

    def held(self) -> list[str]:
        """Task ids this bridge holds: in progress or with an undelivered result."""
        return sorted(set(self.claimed) | set(self.sender.spool.task_ids()))

    async def handle(self, assign: TaskAssignData) -> None:
        """Answer one TASK_ASSIGN and, if taken, run it to its TASK_END."""
        task_id = assign.task_id or uuid.uuid4().hex  # a seed hub sends no taskId
        if await self._held_already(task_id, assign):
            return
        self.claimed[task_id] = assign
        try:
            await self._take(task_id)
            # ended (not stopped by a shutdown): nothing to adopt
            await self.prompts.discard(task_id)
        finally:
            self._release_claim(task_id)
            self.stopped.discard(task_id)

    def _release_claim(self, task_id: str) -> None:
        self.claimed.pop(task_id, None)
        self.answered.discard(task_id)

    async def _held_already(self, task_id: str, assign: TaskAssignData) -> bool:
        """A task this bridge holds, assigned again (a newer attempt): answered here, True;
        False when it is to be run (new here, or its older attempt's machine failure is
        dropped)."""
        running = self.running.get(task_id)
        if task_id in self.stopped or (running is not None and running.cancelled):
            message = "still stopping an older attempt of this task"
            await self._ack(task_id, assign.attempt, ACK_NO_CAPACITY, message)
            return True
        if task_id in self.claimed:
            await self._adopt(task_id, assign, running)
            return True
        ended = self.sender.undelivered(task_id)
        if ended is None:
            return False
        if _machine_failure(ended.body.result()):
            log.info(
                "task %s: attempt %s replaces an undelivered machine failure; running it",
                task_id,
                assign.attempt,
                extra=ctx(task=task_id),
            )
            await self.sender.drop(task_id)
            return False
        log.info(
            "task %s: attempt %s takes the undelivered result over",
            task_id,
            assign.attempt,
            extra=ctx(task=task_id),
        )
        await self.sender.readdress(task_id, assign.webhook_url)
        await self._ack(task_id, assign.attempt)
        return True

    async def _adopt(
        self, task_id: str, assign: TaskAssignData, running: RunningTask | None
    ) -> None:
        """The newer ``assign`` takes over the claimed task: its TASK_ACK now (or from
        :meth:`_take`, which has not answered yet), its attempt on the prompt, its webhook
        for the TASK_END."""
        log.info(
            "task %s: attempt %s takes over the one held here",
            task_id,
            assign.attempt,
            extra=ctx(task=task_id),
        )
        self.claimed[task_id] = assign
        if running is not None:
            running.attempt = assign.attempt
            if task_id in self.prompts:  # a restart re-adopts it as this attempt
                url, started_at = running.instance.url, running.started_at
                await self.prompts.put(HeldPrompt(assign, running.prompt_id, url, started_at))
        if task_id in self.answered:
            await self._ack(task_id, assign.attempt)

    def held_prompts(self) -> list[HeldPrompt]:
        """The prompts a previous run of this bridge left unfinished, claimed now (so
        REGISTER lists them); follow each with :meth:`readopt`."""
        found = self.prompts.load_all()
        for held in found:
            self.claimed[held.task_id] = held.assign
            self.answered.add(held.task_id)  # REGISTER lists it: the hub keeps it here
        return found

    async def readopt(self, held: HeldPrompt) -> None:
        """Follow a prompt a previous run submitted to its end and send its TASK_END."""
        task_id = held.task_id
        try:
            instance = self.pool.by_url(held.instance_url)
            if instance is None:
                where = held.instance_url
                result = machine_failure(
                    "InstanceLost", f"instance {where} is no longer configured"
                )
                await self._finish(task_id, result.result)
            else:
                instance.running.add(task_id)
                task = RunningTask(task_id, held.prompt_id, instance, held.assign.attempt)
                task.started -= max(time.time() - held.started_at, 0.0)  # its cost goes on
                log.info(
                    "task %s: re-adopted prompt %s on %s",
                    task_id,
                    held.prompt_id,
                    instance.instance_id,
                    extra=ctx(task=task_id),
                )
                await self._drive(task, self._resume(task))
            await self.prompts.discard(task_id)
        finally:
            self._release_claim(task_id)

    async def _resume(self, task: RunningTask) -> dict[str, Any]:
        events = task.instance.watch(task.prompt_id)
        try:
            return await self.follow.follow(task, events, look_first=True)
        except InstanceDown as e:
            raise machine_failure("InstanceLost", f"{task.instance.instance_id}: {e}") from None
        finally:
            task.instance.unwatch(task.prompt_id)

    async def _take(self, task_id: str) -> None:
        assign = self.claimed[task_id]
        try:
            workflow = apply_node_info(await self.source.resolve(assign), assign.node_info_list)
        except WorkflowNotFound as e:
            await self._answer(task_id, ACK_WORKFLOW_NOT_FOUND, str(e))
            return
        except WorkflowError as e:
            await self._answer(task_id)
            result = TaskEndResult.failed("task", "InvalidWorkflow", str(e))
            await self._finish(task_id, result)
            return
        if task_id in self.stopped:  # TASK_CANCEL came while the workflow was fetched
            self.stopped.discard(task_id)
            log.info("task %s: cancelled before it started", task_id, extra=ctx(task=task_id))
            return
        needs = needs_of(workflow)
        if lacking := self.pool.lacks(needs):  # no instance here could ever run it
            await self._answer(task_id)
            message = f"no ComfyUI instance of this bridge has {lacking}"
            result = TaskEndResult.failed("task", "NoCapableInstance", message)
            await self._finish(task_id, result)
            return
        instance = self.pool.acquire(
            task_id, needs=needs, affinity=self.settings.affinity, wanted=assign.instance_id
        )
        if instance is None:
            await self._answer(task_id, ACK_NO_CAPACITY, "no free ComfyUI instance")
            return
        attempt = self.claimed[task_id].attempt
        task = RunningTask(task_id, prompt_id_for(task_id, attempt), instance, attempt)
        task.node_names = node_names(workflow)
        self.running[task_id] = task  # before the ACK: a newer attempt meanwhile adopts it
        await self._answer(task_id)
        await self._drive(task, self._execute(task, workflow))

    async def _drive(self, task: RunningTask, run: Coroutine[Any, Any, dict[str, Any]]) -> None:
        """Run ``task`` (``run`` gives its history entry), then its TASK_END; none when the
        hub cancelled it."""
        task.job = asyncio.current_task()
        self.running[task.task_id] = task
        assign = self.claimed.get(task.task_id)
        try:
            with run_span(task, assign.traceparent if assign else None) as span:
                result = await self._outcome(task, run)
                ended(span, result)
        except asyncio.CancelledError:
            if not task.cancelled:
                raise  # a shutdown: the next run re-adopts it, from its history entry
            task.instance.forget(task.prompt_id)
            return  # the hub no longer wants it: no TASK_END
        finally:
            self.running.pop(task.task_id, None)
            self._let_go(task)
        task.instance.forget(task.prompt_id)  # its result is read: ComfyUI may drop it
        if task.cancelled:
            return  # it ended while being stopped: the hub no longer wants it
        await self._finish(task.task_id, result)

    def _let_go(self, task: RunningTask) -> None:
        """``task``'s instance is free: aigcq is told (CAPACITY), once."""
        if not task.let_go:
            task.let_go = True
            self.pool.release(task.instance, task.task_id)
            self.on_free()

    async def _send(self, task: RunningTask, workflow: Workflow) -> None:
        """``POST /prompt``, unless the hub cancelled the task; a TASK_CANCEL that came while
        it was out is carried out once ComfyUI answered (before, the queue had nothing to
        delete and the prompt would have run on a slot the hub already gave away)."""
        if not task.cancelled:
            task.sending = True
            try:
                task.number = await task.instance.submit(workflow, task.prompt_id)
            finally:
                task.sending = False
        if task.cancelled:
            await self._stop(task)
            await self._until_stopped(task)
            raise asyncio.CancelledError

    async def _stop(self, task: RunningTask) -> None:
        await task.instance.cancel(task.prompt_id)
        log.info(
            "task %s: cancelled on %s",
            task.task_id,
            task.instance.instance_id,
            extra=ctx(task=task.task_id),
        )

    async def cancel(self, order: TaskCancelData) -> None:
        """TASK_CANCEL: stop the prompt on its instance (interrupt it only if that
        instance runs it, else delete it from its queue), free the slot, no TASK_END."""
        claim = self.claimed.get(order.task_id)
        if claim is None or order.attempt not in (None, claim.attempt):  # or an older one
            log.info(
                "task %s: TASK_CANCEL for an attempt not running here",
                order.task_id,
                extra=ctx(task=order.task_id),
            )
            return
        task = self.running.get(order.task_id)
        if task is None:
            self.stopped.add(order.task_id)
            return
        task.cancelled = True
        if task.sending:
            return  # _send stops it once ComfyUI has answered
        await self._stop(task)
        # the slot is free when ComfyUI has let the prompt go (an interrupt takes about a
        # second), not when it was asked to: the instance is released, and the hub told
        # (CAPACITY), only then
        await self._until_stopped(task)
        if task.job is not None:
            task.job.cancel()

    async def _until_stopped(self, task: RunningTask) -> None:
        """Until ``task``'s prompt is neither running nor waiting on its instance (at most
        ``STOP_WAIT_S``; an instance that does not answer has let it go)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_WAIT_S
        while loop.time() < deadline:
            try:
                if not await task.instance.queued(task.prompt_id):
                    return
            except InstanceDown:
                return
            await asyncio.sleep(STOP_POLL_S)

    async def _answer(self, task_id: str, code: int = ACK_OK, msg: str = "success") -> None:
        """TASK_ACK for the claimed task's latest attempt (a newer one assigned after this
        is answered by :meth:`_adopt`)."""
        self.answered.add(task_id)
        await self._ack(task_id, self.claimed[task_id].attempt, code, msg)

    async def _ack(
        self, task_id: str, attempt: int | None, code: int = ACK_OK, msg: str = "success"
    ) -> None:
        status = "RUNNING" if code == ACK_OK else "REJECTED"
        body = AckBody(task_id=task_id, task_status=status, attempt=attempt)
        data = TaskAckData(code=code, msg=msg, data=body)
        if code != ACK_OK:  # our current counts, applied by the hub at once (no guess)
            total, free, _ = self.pool.counts()
            data = data.model_copy(
                update={
                    "instance_count": total,
                    "available_instance_count": free,
                    "instances": self.pool.infos(),
                    "tasks": [t for t in self.held() if t != task_id],
                }
            )
        sent = await self.send(TaskAckMessage(data=data))
        log.info(
            "task %s: TASK_ACK code %d%s",
            task_id,
            code,
            "" if sent else " (not connected)",
            extra=ctx(task=task_id),
        )

    async def _finish(self, task_id: str, result: TaskEndResult) -> None:
        """Spool the claimed task's TASK_END (on disk when this returns) and send it, to its
        latest attempt's webhook."""
        webhook_url = self.claimed[task_id].webhook_url
        log.info(
            "task %s: finished, code %d: %s",
            task_id,
            result.code,
            result.msg,
            extra=ctx(task=task_id),
        )
        await self.sender.send(SpooledResult(webhook_url, TaskEndBody.build(task_id, result)))

    async def _outcome(
        self, task: RunningTask, run: Coroutine[Any, Any, dict[str, Any]]
    ) -> TaskEndResult:
        try:
            entry = await run
            self._let_go(task)  # ComfyUI is done with it: its files come while it runs another
            files = await self.follow.collect(task, entry)
        except TaskFailed as e:
            return e.result
        except PromptRejected as e:  # ComfyUI's validation: the workflow's fault
            return TaskEndResult.failed("task", "PromptValidation", str(e))
        except Exception as e:  # a bridge bug must still end the task
            log.exception("task %s: unexpected error", task.task_id, extra=ctx(task=task.task_id))
            return machine_failure("BridgeError", f"bridge error: {type(e).__name__}: {e}").result
        return TaskEndResult(code=0, msg="success", data=files)

    async def _execute(self, task: RunningTask, workflow: Workflow) -> dict[str, Any]:
        """Run the prompt, moving to another free instance while instances are down; none
        free: a machine's failure, the hub retries the task elsewhere."""
        tried: set[str] = set()
        while True:
            try:
                return await self._run_on(task, workflow)
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
                needs, affinity = needs_of(workflow), self.settings.affinity
                other = self.pool.acquire(task.task_id, frozenset(tried), needs, affinity)
                if other is None:
                    raise machine_failure(
                        "InstanceLost", f"no ComfyUI instance free ({e})"
                    ) from None
                task.instance, task.let_go = other, False  # the new one is held

    async def _run_on(self, task: RunningTask, workflow: Workflow) -> dict[str, Any]:
        instance = task.instance
        workflow = await place_inputs(workflow, instance, self.source)  # uploaded inputs
        events = instance.watch(task.prompt_id)
        try:
            # Held before it is sent: a restart between ComfyUI's accept and a later write
            # would run the prompt twice; one ComfyUI never got is found lost on re-adoption.
            assign = self.claimed[task.task_id]
            held = HeldPrompt(assign, task.prompt_id, instance.url, task.started_at)
            await self.prompts.put(held)
            await self._send(task, workflow)
            log.info(
                "task %s: submitted to %s as %s",
                task.task_id,
                instance.instance_id,
                task.prompt_id,
                extra=ctx(task=task.task_id),
            )
            return await self.follow.follow(task, events)
        finally:
            instance.unwatch(task.prompt_id)


def _machine_failure(result: TaskEndResult) -> bool:
    """A failure of the machine (a seed-style failure without a class counts as one)."""
    return result.code != 0 and (result.failure is None or result.failure.failure_class != "task")
