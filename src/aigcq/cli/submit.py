"""The CLI's submit: tasks through the client SDK over one connection, followed in one
live display (a row per task still running: its state, or its node's steps; a line per
task done), so several tasks never garble each other's progress.

What a submit takes (:func:`jobs_given`, :func:`jobs_in_file`) is checked whole before
anything is sent: a bad payload or line is an :class:`InputError` and submits nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import Progress as Display
from rich.progress import SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from aigcq.cli.remote import InputError, refusal
from aigcq.cli.status import failure_text
from aigcq.client import AigcqError, AsyncClient, Progress, Result
from aigcq.domain import failure_of


@dataclass(frozen=True, slots=True)
class Job:
    """One task to submit."""

    platform: str
    payload: dict[str, Any]
    task_id: str
    aigc: str | None = None


#: a task's end: its result (without empty fields), or why it has none
Outcome = dict[str, Any] | AigcqError


def jobs_given(
    platform: str, payloads: list[str], *, task_id: str | None, aigc: str | None
) -> list[Job]:
    """A task per payload (JSON, or ``@file.json``), all on ``platform``."""
    if task_id and len(payloads) > 1:
        raise InputError("--task-id names one task: give one PAYLOAD (or taskId in --file lines)")
    return [Job(platform, read_payload(p), task_id or new_id(), aigc) for p in payloads]


def jobs_in_file(path: Path, *, aigc: str | None) -> list[Job]:
    """A task per non-empty line of ``path`` (``-``: stdin), each a JSON object
    ``{"platform", "payload", "taskId"?, "AIGC"?}`` (``AIGC`` defaults to ``aigc``)."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        job = _job_of(line, aigc, where=f"{path} line {number}")
        if job.task_id in seen:
            where = f"{path} line {number}"
            raise InputError(f"{where}: taskId {job.task_id!r} is line {seen[job.task_id]}'s too")
        seen[job.task_id] = number
        jobs.append(job)
    if not jobs:
        raise InputError(f"{path}: no task in it (one JSON object a line)")
    return jobs


def _job_of(line: str, aigc: str | None, where: str) -> Job:
    try:
        fields = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise InputError(f"{where}: not a JSON object")
    checks = (
        ("platform", str, "a string"),
        ("payload", dict, "an object"),
        ("taskId", str, "a string"),
        ("AIGC", str, "a string"),
    )
    for key, kind, what in checks:
        value = fields.get(key)
        if (value is not None or key in ("platform", "payload")) and not isinstance(value, kind):
            raise InputError(f"{where}: {key} must be {what}")
    return Job(fields["platform"], fields["payload"], fields.get("taskId") or new_id(),
               fields.get("AIGC", aigc))  # fmt: skip


def read_payload(payload: str) -> dict[str, Any]:
    """``payload`` (JSON, or ``@file.json``) as a JSON object; :class:`InputError` if not."""
    if payload.startswith("@"):
        try:
            payload = Path(payload[1:]).read_text()
        except OSError as exc:
            raise InputError(f"cannot read payload file {payload[1:]}: {exc.strerror}") from exc
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise InputError(f"payload is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InputError(f"payload must be a JSON object, not {type(body).__name__}")
    return body


def new_id() -> str:
    return uuid.uuid4().hex


async def submit_all(
    server: str,
    token: str,
    backend_id: str,
    jobs: list[Job],
    *,
    timeout: float,
    console: Console,
) -> list[Outcome]:
    """Submit every job over one connection and follow each until its result (success,
    failed or cancelled) or its refusal, shown on ``console``; the outcomes in the jobs'
    order. Each has ``timeout`` s from its submit.

    A connection lost or refused (bad token, server down) raises (``OSError``,
    :class:`AigcqError`...), ending them all.
    """
    async with AsyncClient(server, token, backend_id) as client:
        with Board(console, jobs) as board:
            runs = (_run(client, job, board, timeout) for job in jobs)
            return list(await asyncio.gather(*runs))


async def _run(client: AsyncClient, job: Job, board: Board, timeout: float) -> Outcome:
    outcome: Outcome
    try:
        async with asyncio.timeout(timeout):
            await client.submit(job.platform, job.payload, task_id=job.task_id, aigc=job.aigc)
            board.show(job.task_id, "queued")
            outcome = await _follow(client, job.task_id, board)
    except TimeoutError:
        msg = f"no result within {timeout:g} s (--timeout)"
        outcome = AigcqError("Timeout", msg, task_id=job.task_id)
    except AigcqError as exc:  # SubmitError: refused
        outcome = exc
    board.done(job.task_id, outcome)
    return outcome


async def _follow(client: AsyncClient, task_id: str, board: Board) -> dict[str, Any]:
    async for event in client.events(task_id):
        if isinstance(event, Result):
            return printable(event)
        board.show(task_id, describe(event))
    raise AigcqError("Disconnected", "the server closed the connection", task_id=task_id)


class Board:
    """The live display: a row per task until it ends, then a line for it (with several
    tasks), and a count of those done. Drawn only on a terminal."""

    def __init__(self, console: Console, jobs: list[Job]) -> None:
        self.size = len(jobs)
        self.several = self.size > 1
        self.display = Display(
            SpinnerColumn(),
            TextColumn("{task.fields[name]}"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.rows: dict[str, TaskID] = {}
        self.total = self.display.add_task("", total=self.size, name="", visible=self.several)
        for job in jobs:
            self.rows[job.task_id] = self.display.add_task("submitting", name=job.task_id)
        self._count(len(self.rows))

    def __enter__(self) -> Board:
        if self.display.console.is_terminal:  # else only the lines, nothing redrawn
            self.display.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.display.live.is_started:
            self.display.stop()

    def show(self, task_id: str, text: str) -> None:
        self.display.update(self.rows[task_id], description=text)

    def done(self, task_id: str, outcome: Outcome) -> None:
        self.display.remove_task(self.rows.pop(task_id))
        self._count(len(self.rows))
        if self.several:
            self.display.console.print(f"{task_id}: {ended(outcome)}", highlight=False)

    def _count(self, left: int) -> None:
        done = self.size - left
        self.display.update(self.total, completed=done, description=f"{done} of {self.size} done")


def ended(outcome: Outcome) -> str:
    """``success``, ``failed: PromptValidation (task): …`` or ``refused: PlatformError: …``."""
    if isinstance(outcome, AigcqError):
        return f"refused: {refusal(outcome)}"
    failure = failure_of(outcome.get("error"))
    return str(outcome["status"]) + (f": {failure_text(failure)}" if failure else "")


def printable(result: Result) -> dict[str, Any]:
    """The result's fields that carry something (no ``null``s, no outbox entry id)."""
    fields = dataclasses.asdict(result)
    return {k: v for k, v in fields.items() if v is not None and k != "id"}


def as_line(job: Job, outcome: Outcome) -> dict[str, Any]:
    """An outcome as one JSON line of a several-task submit: the result, or for a refusal
    ``{"task_id", "status": "refused", "code", "msg", "detail"}``."""
    if isinstance(outcome, AigcqError):
        return {"task_id": job.task_id, "status": "refused", "code": outcome.code,
                "msg": outcome.msg, "detail": outcome.detail}  # fmt: skip
    return outcome


def lines(jobs: list[Job], outcomes: list[Outcome]) -> Iterator[str]:
    for job, outcome in zip(jobs, outcomes, strict=True):
        yield json.dumps(as_line(job, outcome), ensure_ascii=False)


def describe(progress: Progress) -> str:
    """``running on runninghub``, or ``KSampler [████████░░░░░░░░░░░░] step 2/5`` (the
    node's name; ``node 3`` when the bridge does not send it)."""
    if progress.state is not None:
        return f"{progress.state} on {progress.target}"
    node = f"{progress.node_name} " if progress.node_name else ""
    node = node or (f"node {progress.node} " if progress.node else "")
    if progress.value is None or not progress.max:
        return f"{node}running".lstrip()
    done = max(0, min(20, round(20 * progress.value / progress.max)))
    return f"{node}[{'█' * done}{'░' * (20 - done)}] step {progress.value}/{progress.max}"
