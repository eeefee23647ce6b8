"""Comfy API v2 (``/api/v2/...``): the official ComfyUI job API as a door onto aigcq's queue.

Code written for ``comfy-sdk`` (``COMFY_BASE_URL`` set to aigcq, a client token as the API
key) runs on the fleet unchanged. A v2 job IS an aigcq task: its id is the task id, its
API-format graph the task's inline ``workflow`` (run on a bridge like any task of the
``comfyui`` queue of the server's default project), its labels the task payload's
``metadata``. The door translates; what it keeps beside the task hash is an index: each
``Idempotency-Key`` -> the job it created (single-use, as the shipped contract says: any
reuse is ``422 idempotency_key_reuse`` naming that job), and the v2 jobs by creation time
(the list route), both with the result retention as their lifetime.
docs/comfy-api-v2.md has the surface; ../shared/reference/comfy-api-v2.md what the SDK sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import mimetypes
import posixpath
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

import blake3
import httpx
import orjson
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.gateway.errors import ClientError
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.http_api import bounded_body
from aigcq.gateway.submission import GenerateRequest
from aigcq.gateway.v2_assets import Assets
from aigcq.gateway.v2_errors import V2Error
from aigcq.plumbing.auth import Principal, bearer
from aigcq.plumbing.text import text
from aigcq.queue.store import task_from_hash

log = logging.getLogger(__name__)

#: the queue (of the default project) v2 jobs join: the one our bridges serve
PLATFORM = "comfyui"
#: the task owner of jobs submitted with a token that names no client (static, admin)
ANONYMOUS = "comfy-v2"
#: an SSE stream's comment line after this long without an event (the SDK reads 45 s)
KEEPALIVE_S = 15.0
#: how often an event stream re-reads its task when no event woke it
POLL_S = 0.5
#: how long a job's view waits for its outputs' sizes and hashes, measured once (then
#: kept as long as the task): a slower measure goes on, the view says ``0`` / ``null``
MEASURE_WAIT_S = 3.0
#: a ``queue_full`` refusal's ``Retry-After`` (seconds)
RETRY_AFTER_S = 2
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 50
MAX_METADATA_PAIRS = 32
MAX_METADATA_TEXT = 1024

Authorization = Annotated[str | None, Header()]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]

STATUS = {
    TaskState.PENDING: "queued",
    TaskState.DISPATCHING: "queued",
    TaskState.RUNNING: "running",
    TaskState.SUCCESS: "succeeded",
    TaskState.FAILED: "failed",
    TaskState.CANCELLED: "canceled",
}
TERMINAL = frozenset({"succeeded", "failed", "canceled", "expired"})
#: the events a stream passes on as they come (live news, not read from the task)
LIVE = frozenset({"progress", "log"})

_KINDS = {
    "image": {"png", "jpg", "jpeg", "webp", "gif", "bmp", "tiff", "avif"},
    "video": {"mp4", "webm", "mov", "mkv", "avi"},
    "audio": {"wav", "mp3", "flac", "ogg", "m4a", "opus"},
    "text": {"txt", "json", "md"},
    "latent": {"latent"},
}


def _not_found(job_id: str) -> V2Error:
    return V2Error(404, "not_found", f"no job {job_id!r}", {"job_id": job_id})


#: aigcq's refusals of a submit as v2 errors (status, code)
_REFUSALS: dict[str, tuple[int, str]] = {
    ErrorCode.BALANCE: (402, "insufficient_credits"),
    ErrorCode.AUTH: (403, "forbidden"),
    ErrorCode.PLATFORM: (503, "service_unavailable"),
    ErrorCode.ASSESSMENT: (503, "service_unavailable"),
    ErrorCode.CONFLICT: (409, "conflict"),
    ErrorCode.JSON: (422, "invalid_request"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "payload_too_large"),
}


def _from_client_error(exc: ClientError) -> V2Error:
    status, code = _REFUSALS.get(exc.code, (exc.status, "invalid_request"))
    return V2Error(status, code, exc.detail or str(exc.code))


# -- the graph --------------------------------------------------------------------------


def is_ui_format(graph: Any) -> bool:
    """A graph saved by ComfyUI's editor (``nodes``, ``links``, ``last_node_id``), not the
    API format ``POST /prompt`` runs."""
    return isinstance(graph, dict) and {"nodes", "links", "last_node_id"} <= graph.keys()


def node_errors(graph: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """What is wrong with each node of an API-format graph (empty: nothing this door can
    tell; ComfyUI's own validation on the bridge fails the job ``PromptValidation``)."""
    errors: dict[str, list[dict[str, str]]] = {}
    for node_id, node in graph.items():
        found: list[dict[str, str]] = []
        if not isinstance(node, dict):
            found.append({"field": "", "reason": "not_an_object"})
        else:
            if not isinstance(node.get("class_type"), str) or not node.get("class_type"):
                found.append({"field": "class_type", "reason": "missing_class_type"})
            inputs = node.get("inputs", {})
            if not isinstance(inputs, dict):
                found.append({"field": "inputs", "reason": "not_an_object"})
            else:
                for name, value in inputs.items():
                    if _is_link(value) and value[0] not in graph:
                        found.append({"field": name, "reason": "link_to_missing_node"})
        if found:
            errors[str(node_id)] = found
    return errors


def _is_link(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    )


def _checked_graph(body: dict[str, Any]) -> dict[str, Any]:
    graph = body.get("workflow")
    if is_ui_format(graph):
        raise V2Error(
            422,
            "workflow_format_ui",
            "this is a UI-format workflow (nodes/links); export it in API format",
        )
    if not isinstance(graph, dict) or not graph:
        raise V2Error(422, "invalid_workflow", "workflow: an API-format graph (a JSON object)")
    errors = node_errors(graph)
    if errors:
        first = next(iter(errors))
        why = errors[first][0]
        raise V2Error(
            422,
            "invalid_workflow",
            f"node {first}: {why['reason']} {why['field']}".strip(),
            {"node_errors": errors},
        )
    return graph


def _checked_metadata(body: dict[str, Any]) -> dict[str, str] | str:
    """String labels (``comfy-sdk``, Comfy's hosted API), or one opaque string as
    ``comfy-api-proxy`` takes it (kept and shown as given; list filters never match it)."""
    metadata = body.get("metadata")
    if metadata is None:
        return {}
    if isinstance(metadata, str):
        if len(metadata.encode()) > MAX_METADATA_TEXT:
            raise V2Error(422, "invalid_metadata", f"metadata: at most {MAX_METADATA_TEXT} bytes")
        return metadata
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_PAIRS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise V2Error(
            422,
            "invalid_metadata",
            f"metadata: an object of at most {MAX_METADATA_PAIRS} string labels",
        )
    return dict(metadata)


def _checked_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not all(" " <= c <= "~" for c in key):
        raise V2Error(400, "invalid_request", "Idempotency-Key: 1-255 printable ASCII characters")
    return key


# -- a task as a Job ----------------------------------------------------------------------


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def _kind(name: str) -> str:
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return next((kind for kind, exts in _KINDS.items() if ext in exts), "file")


def result_files(task: Task) -> list[dict[str, Any]]:
    """A succeeded task's files as its result lists them (``fileUrl``, ``nodeId``…)."""
    result = task.result
    data = result.get("data") if isinstance(result, dict) else result
    if not isinstance(data, list):
        return []
    return [f for f in data if isinstance(f, dict) and isinstance(f.get("fileUrl"), str)]


def asset_id(task_id: str, index: int) -> str:
    return f"{task_id}~{index}"


def parse_asset_id(value: str) -> tuple[str, int] | None:
    task_id, sep, index = value.rpartition("~")
    if not sep or not task_id or not index.isdigit():
        return None
    return task_id, int(index)


@dataclass
class Live:
    """What this process heard of a running job (progress is live news, never stored)."""

    nodes: list[str] = field(default_factory=list)  # the nodes reported, in order
    step: int | None = None
    steps: int | None = None
    node: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Feed:
    """One job as its event streams on this process follow it (one per base URL)."""

    subscribers: set[asyncio.Queue[tuple[str, Any]]] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: the last status change sent, for a stream that joins later
    last: dict[str, Any] | None = None
    stepped: bool = False  # a step was reported since the last read
    runner: asyncio.Future[None] | None = None

    def send(self, kind: str, data: Any) -> None:
        for queue in self.subscribers:
            if kind not in LIVE or queue.qsize() < 32:  # a slow reader skips progress, logs
                queue.put_nowait((kind, data))


class ComfyV2:
    """The door: routes, and the live progress each job's event streams follow."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.rt = gw.rt
        #: each watched job's feeds (one per job and base URL), whatever their streams
        self.feeds: dict[str, dict[str, Feed]] = {}
        self.live: dict[str, Live] = {}
        self._http: httpx.AsyncClient | None = None
        self._measuring: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self.assets = Assets(self.rt)  # uploaded inputs (/api/v2/assets)

    # keys beside the task hashes (an index, no state of the job's own)
    def _idem_key(self, owner: str, key: str) -> str:
        return f"{self.rt.store.keys.prefix}:v2:idem:{owner}:{key}"

    @property
    def _index(self) -> str:
        return f"{self.rt.store.keys.prefix}:v2:jobs"

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        return self._http

    async def aclose(self) -> None:
        for feeds in list(self.feeds.values()):
            for feed in list(feeds.values()):
                if feed.runner is not None:
                    feed.runner.cancel()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- live news from the event bus -------------------------------------------------
    def progress(self, _backend_id: str, message: dict[str, Any]) -> None:
        """A TASK_PROGRESS relayed on the event bus (every process hears it): kept for the
        job's progress and handed to its event streams. Never waits."""
        task_id = message.get("taskId")
        if not isinstance(task_id, str):
            return
        news = _log_of(message, self.live.get(task_id))
        if _is_step(message):
            live = self.live.get(task_id)
            if live is None:
                if len(self.live) >= 4096:  # the oldest go: progress is best effort
                    for old in sorted(self.live, key=lambda t: self.live[t].at)[:1024]:
                        del self.live[old]
                live = self.live[task_id] = Live()
            node = message.get("node")
            if isinstance(node, str) and node not in live.nodes:
                live.nodes.append(node)
            live.node = node if isinstance(node, str) else live.node
            live.step = _int(message.get("value"))
            live.steps = _int(message.get("max"))
            live.at = time.monotonic()
        for feed in self.feeds.get(task_id, {}).values():
            feed.stepped = feed.stepped or _is_step(message)
            if news is not None:
                feed.send("log", news)
            feed.wake.set()

    def task_ended(self, task_id: str) -> None:
        """Wakes the streams of a task that ended on this process."""
        self.live.pop(task_id, None)
        for feed in self.feeds.get(task_id, {}).values():
            feed.wake.set()

    # -- auth and ownership --------------------------------------------------------------
    def _owner(self, authorization: str | None) -> Principal:
        """Whom the caller's client token speaks for (its jobs: see :func:`_reads`)."""
        principal = self.gw.auth.client(bearer(authorization))
        if principal is None:
            raise V2Error(401, "unauthorized", "a client token is the API key (Bearer)")
        return principal

    async def _task(self, job_id: str, owner: Principal) -> Task:
        task = await self.rt.store.reads.get(job_id)
        if task is None or not _reads(owner, task.backend_id):
            raise _not_found(job_id)
        return task

    # -- the Job ---------------------------------------------------------------------------
    async def job(self, task: Task, base: str) -> dict[str, Any]:
        status = STATUS[task.state]
        failure = task.failure
        if status == "failed" and failure and failure["code"] == ErrorCode.TASK_EXPIRED:
            status = "expired"
        timeline = await self.rt.store.reads.timeline(task.task_id)
        started = next(
            (e["t"] for e in reversed(timeline) if e.get("state") == TaskState.RUNNING), None
        )
        completed = task.updated_at if task.state.terminal else None
        expires = (completed or time.time()) + self.rt.settings.result_retention_s
        position = None
        if task.state is TaskState.PENDING:
            queue = (task.aigc, task.platform)
            position = (await self.gw.queue_updates.waiting(task.task_id, queue))["position"]
            if position is None:  # not laid out yet (the estimate is periodic): its rank
                rank = await self.rt.redis.zrank(self.rt.store.keys.wait(*queue), task.task_id)
                position = rank if isinstance(rank, int) else None
            position = None if position is None else position + 1
        self_url = f"{base}/api/v2/jobs/{task.task_id}"
        job: dict[str, Any] = {
            "id": task.task_id,
            "status": status,
            "created_at": _iso(task.created_at),
            "started_at": _iso(started),
            "completed_at": _iso(completed),
            "expires_at": _iso(expires),
            "queue_position": position,
            "progress": self._progress(task, status),
            "outputs": (
                self._outputs(task, base, expires, await self._measured(task))
                if status == "succeeded"
                else []
            ),
            "error": _job_error(task) if status in ("failed", "expired") else None,
            "metrics": {
                "queue_ms": None if started is None else int((started - task.created_at) * 1000),
                "execution_ms": (
                    None
                    if started is None or completed is None
                    else int((completed - started) * 1000)
                ),
            },
            "metadata": (
                task.payload["metadata"]
                if isinstance(task.payload.get("metadata"), str)
                else _metadata(task)
            ),
            "urls": {
                "self": self_url,
                "events": f"{self_url}/events",
                "cancel": f"{self_url}/cancel",
            },
        }
        return job

    def _progress(self, task: Task, status: str) -> dict[str, Any] | None:
        total = len(_graph(task) or {}) or 1
        if status == "succeeded":
            return {"value": 1.0, "nodes_done": total, "nodes_total": total}
        if status != "running":
            return None
        live = self.live.get(task.task_id)
        if live is None:
            return {"value": 0.0, "nodes_done": 0, "nodes_total": total}
        done = max(len(live.nodes) - 1, 0)
        part = (live.step or 0) / live.steps if live.steps else 0.0
        value = min((done + min(part, 1.0)) / total, 1.0)
        progress: dict[str, Any] = {
            "value": value,
            "nodes_done": min(done, total),
            "nodes_total": total,
            "step": live.step,
            "steps": live.steps,
        }
        if live.node is not None:
            progress["current_node"] = live.node
            node = (_graph(task) or {}).get(live.node)
            if isinstance(node, dict) and isinstance(node.get("class_type"), str):
                progress["current_node_class"] = node["class_type"]
        return progress

    def _outputs(
        self, task: Task, base: str, expires: float, facts: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        outputs = []
        for index, file in enumerate(result_files(task)):
            fact = facts[index] if index < len(facts) else {}
            name = posixpath.basename(urlsplit(file["fileUrl"]).path) or f"output_{index}"
            aid = asset_id(task.task_id, index)
            content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
            size = file.get("fileSize", file.get("size"))
            outputs.append(
                {
                    "node_id": str(file.get("nodeId") or ""),
                    "name": name,
                    "type": _kind(name),
                    "content_type": content_type,
                    "size_bytes": fact.get("size", size if isinstance(size, int) else 0),
                    "id": aid,
                    "hash": fact.get("hash"),
                    "url": f"{base}/api/v2/assets/{aid}/content",
                    "url_expires_at": _iso(expires),
                    "job_id": task.task_id,
                }
            )
        return outputs

    async def _measured(self, task: Task) -> list[dict[str, Any]]:
        """Each output's ``size`` and ``hash`` (``blake3:<hex>``), measured once by reading
        its file and kept beside the task for as long as the task; ``[]`` while unknown."""
        key = f"{self.rt.store.keys.prefix}:v2:files:{task.task_id}"
        raw = await self.rt.redis.get(key)
        if raw is not None:
            facts: list[dict[str, Any]] = orjson.loads(raw)
            return facts
        pending = self._measuring.get(task.task_id)
        if pending is None:
            pending = asyncio.ensure_future(self._measure(task, key))
            self._measuring[task.task_id] = pending
            pending.add_done_callback(functools.partial(self._measure_done, task.task_id))
        try:
            return await asyncio.wait_for(asyncio.shield(pending), MEASURE_WAIT_S)
        except Exception:  # slow or unreachable: measured later
            return []

    def _measure_done(self, task_id: str, done: asyncio.Future[list[dict[str, Any]]]) -> None:
        self._measuring.pop(task_id, None)
        if not done.cancelled() and done.exception() is not None:
            log.info("job %s: outputs not measured: %r", task_id, done.exception())

    async def _measure(self, task: Task, key: str) -> list[dict[str, Any]]:
        facts: list[dict[str, Any]] = []
        limit = self.rt.settings.result_custody_max_bytes
        for file in result_files(task):
            hasher, size = blake3.blake3(), 0
            async with self.http.stream("GET", file["fileUrl"]) as resp:
                resp.raise_for_status()
                length = resp.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > limit:  # too large to hash: its size
                    facts.append({"size": int(length), "hash": None})
                    continue
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size <= limit:
                        hasher.update(chunk)
            digest = f"blake3:{hasher.hexdigest()}" if size <= limit else None
            facts.append({"size": size, "hash": digest})
        ttl = self.rt.settings.result_retention_s + 3600
        await self.rt.redis.set(key, orjson.dumps(facts), ex=ttl)
        return facts

    # -- submit ------------------------------------------------------------------------------
    async def submit(self, request: Request, owner: Principal, key: str | None) -> Task:
        raw = await _body(request, self.rt.settings.max_payload_bytes)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise V2Error(400, "invalid_request", f"malformed JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise V2Error(400, "invalid_request", "the body must be a JSON object")
        graph = _checked_graph(body)
        metadata = _checked_metadata(body)
        backend_id = _backend(owner)
        graph = await self.assets.resolve(graph, backend_id, functools.partial(_reads, owner))
        project = self.rt.settings.comfy_v2_project or self.rt.settings.project_prefix
        task_id = str(uuid.uuid4())
        idem = None if key is None else self._idem_key(backend_id, key)
        ttl = max(self.rt.settings.result_retention_s, 86400)
        if idem is not None and not await self.rt.redis.set(idem, task_id, nx=True, ex=ttl):
            existing = text(await self.rt.redis.get(idem))
            raise V2Error(
                422,
                "idempotency_key_reuse",
                "this Idempotency-Key was used already (keys are single-use)",
                {"job_id": existing, "existing_job_id": existing},
            )
        try:
            await self._room(project)
        except V2Error:
            if idem is not None:
                await self.rt.redis.delete(idem)
            raise
        payload: dict[str, Any] = {"workflow": graph}
        if metadata:
            payload["metadata"] = metadata
        req = GenerateRequest.model_validate(
            {"taskId": task_id, "platform": PLATFORM, "payload": payload, "AIGC": project}
        )
        req.traceparent = request.headers.get("traceparent")
        try:
            await self.gw.submission.submit(req, backend_id, deliver=False, principal=owner.name)
        except ClientError as exc:
            if idem is not None and exc.code != ErrorCode.ASSESSMENT:  # refused: key free
                await self.rt.redis.delete(idem)
            raise _from_client_error(exc) from exc
        now = time.time()
        pipe = self.rt.redis.pipeline(transaction=False)
        pipe.zadd(self._index, {task_id: now})
        pipe.zremrangebyscore(self._index, "-inf", now - self.rt.settings.result_retention_s)
        await pipe.execute()
        return await self._task(task_id, owner)

    async def _room(self, project: str) -> None:
        """``429 queue_full`` when the queue holds ``AIGCQ_COMFY_V2_MAX_WAITING`` waiting."""
        limit = self.rt.settings.comfy_v2_max_waiting
        if limit and await self.rt.redis.zcard(self.rt.store.keys.wait(project, PLATFORM)) >= limit:
            raise V2Error(
                429,
                "queue_full",
                f"the queue holds {limit} waiting jobs (AIGCQ_COMFY_V2_MAX_WAITING)",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    # -- list ----------------------------------------------------------------------------
    async def list_jobs(
        self, owner: Principal, filters: dict[str, str], limit: int, cursor: int
    ) -> dict[str, Any]:
        jobs: list[dict[str, Any]] = []
        position = cursor
        chunk = 200
        while len(jobs) < limit:
            ids = await self.rt.redis.zrevrange(self._index, position, position + chunk - 1)
            if not ids:
                return {"jobs": jobs}
            pipe = self.rt.redis.pipeline(transaction=False)
            for raw_id in ids:
                pipe.hgetall(self.rt.store.keys.task(text(raw_id)))
            found = {t.task_id: t for t in (task_from_hash(r) for r in await pipe.execute() if r)}
            for raw_id in ids:
                position += 1
                task = found.get(text(raw_id))
                if task is None or not _reads(owner, task.backend_id):
                    continue
                labels = _metadata(task)
                if any(labels.get(k) != v for k, v in filters.items()):
                    continue
                jobs.append(_summary(task, labels))
                if len(jobs) >= limit:
                    break
        more = await self.rt.redis.zcard(self._index) > position
        return {"jobs": jobs, **({"next_cursor": str(position)} if more else {})}

    # -- events ------------------------------------------------------------------------------
    async def events(self, job_id: str, base: str) -> AsyncIterator[bytes]:
        """The job's SSE stream: ``status`` at each change (with ``queue_position``),
        ``progress`` as the bridge reports it, ``log`` lines (where it runs: ``bridge`` or
        the paid platform, each node starting, how it ended), each ``output``, then the
        terminal ``status`` (which ends the stream, as the SDK expects). Every stream of a
        job reads one :class:`Feed` (one read of the task per change, however many watch)."""
        feed = self.feeds.get(job_id, {}).get(base)
        if feed is None:
            feed = self.feeds.setdefault(job_id, {})[base] = Feed()
            feed.runner = asyncio.ensure_future(self._follow(feed, job_id, base))
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        feed.subscribers.add(queue)
        if feed.last is not None:
            queue.put_nowait(("status", feed.last))
        try:
            while True:
                try:
                    kind, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if kind == "end":
                    return
                if kind in LIVE:
                    yield _sse(kind, data)
                    continue
                for frame in _status_frames(data):
                    yield frame
                if data["status"] in TERMINAL:
                    return
        finally:
            feed.subscribers.discard(queue)

    async def _follow(self, feed: Feed, job_id: str, base: str) -> None:
        """Reads the job for its streams: at once, when woken (its progress, its end on
        this process), and every :data:`POLL_S` (an end applied on another process)."""
        said: tuple[str, int | None] | None = None
        try:
            while feed.subscribers or said is None:
                feed.wake.clear()
                task = await self.rt.store.reads.get(job_id)
                if task is None:
                    return
                job = await self.job(task, base)
                status = (job["status"], job["queue_position"])
                if status != said:
                    started = job["status"] == "running" and (said is None or said[0] != "running")
                    feed.last, said = job, status
                    feed.send("status", job)
                    if started:
                        feed.send("log", {"level": "info", "message": f"running on {task.target}"})
                    if job["status"] in TERMINAL:
                        return
                elif feed.stepped and status[0] == "running":
                    feed.send("progress", self._progress(task, "running"))
                feed.stepped = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(feed.wake.wait(), POLL_S)
        finally:
            feeds = self.feeds.get(job_id, {})
            if feeds.get(base) is feed:
                del feeds[base]
                if not feeds:
                    self.feeds.pop(job_id, None)
            feed.send("end", None)

    # -- asset content ------------------------------------------------------------------------
    async def content(self, value: str, owner: Principal, range_header: str | None) -> Response:
        parsed = parse_asset_id(value)
        if parsed is None:  # an uploaded input's id
            return await self.assets.content(value, functools.partial(_reads, owner))
        task_id, index = parsed
        task = await self.rt.store.reads.get(task_id)
        if task is None or not _reads(owner, task.backend_id):
            raise V2Error(404, "asset_not_found", f"no asset {value!r}")
        files = result_files(task) if task.state is TaskState.SUCCESS else []
        if index >= len(files):
            raise V2Error(404, "asset_not_found", f"no asset {value!r}")
        url = files[index]["fileUrl"]
        headers = {"Range": range_header} if range_header else {}
        try:
            upstream = await self.http.send(
                self.http.build_request("GET", url, headers=headers), stream=True
            )
        except httpx.HTTPError as exc:
            raise V2Error(502, "output_unavailable", f"its file is unreachable: {exc!r}") from exc
        if upstream.status_code == 404:
            await upstream.aclose()
            raise V2Error(404, "output_unavailable", "its file is gone")
        if upstream.status_code == 416:
            await upstream.aclose()
            raise V2Error(416, "range_not_satisfiable", "the range is outside the file")
        if upstream.status_code not in (200, 206):
            await upstream.aclose()
            raise V2Error(502, "output_unavailable", f"its file answered {upstream.status_code}")
        name = posixpath.basename(urlsplit(url).path)
        out_headers = {"Accept-Ranges": "bytes"}
        for h in ("Content-Length", "Content-Range", "ETag", "Last-Modified"):
            if h in upstream.headers:
                out_headers[h] = upstream.headers[h]
        media = upstream.headers.get("Content-Type") or mimetypes.guess_type(name)[0]

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(
            body(), upstream.status_code, headers=out_headers, media_type=media
        )

    # -- routes -----------------------------------------------------------------------------
    def router(self) -> APIRouter:
        router = APIRouter(prefix="/api/v2", tags=["comfy-api-v2"])

        @router.get(
            "/health", summary="Comfy API v2: health", openapi_extra={"security": [{}]}
        )  # open, as the proxy's
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @router.post("/jobs", status_code=201, summary="Comfy API v2: submit a job")
        async def submit(
            request: Request,
            authorization: Authorization = None,
            idempotency_key: IdempotencyKey = None,
        ) -> JSONResponse:
            owner = self._owner(authorization)
            task = await self.submit(request, owner, _checked_key(idempotency_key))
            job = await self.job(task, _base(request))
            return JSONResponse(job, 201, headers={"Location": job["urls"]["self"]})

        @router.get("/jobs", summary="Comfy API v2: list jobs, newest first")
        async def list_jobs(request: Request, authorization: Authorization = None) -> Any:
            owner = self._owner(authorization)
            filters, limit, cursor = _list_query(request)
            return await self.list_jobs(owner, filters, limit, cursor)

        @router.get("/jobs/{job_id}", summary="Comfy API v2: a job")
        async def get_job(
            job_id: str, request: Request, authorization: Authorization = None
        ) -> Any:
            owner = self._owner(authorization)
            return await self.job(await self._task(job_id, owner), _base(request))

        @router.post("/jobs/{job_id}/cancel", summary="Comfy API v2: cancel a job")
        async def cancel(job_id: str, request: Request, authorization: Authorization = None) -> Any:
            owner = self._owner(authorization)
            task = await self._task(job_id, owner)
            if not task.state.terminal:
                await self.gw.lifecycle.cancelled(task, by_client=owner.ids is not None)
                task = await self._task(job_id, owner)
            return await self.job(task, _base(request))

        @router.get("/jobs/{job_id}/workflow", summary="Comfy API v2: a job's graph")
        async def workflow(job_id: str, authorization: Authorization = None) -> Any:
            owner = self._owner(authorization)
            graph = _graph(await self._task(job_id, owner))
            if graph is None:
                raise V2Error(404, "not_found", f"job {job_id!r} has no inline workflow")
            return {"workflow": graph, "format": "api"}

        @router.get("/jobs/{job_id}/events", summary="Comfy API v2: a job's events (SSE)")
        async def events(
            job_id: str, request: Request, authorization: Authorization = None
        ) -> StreamingResponse:
            owner = self._owner(authorization)
            await self._task(job_id, owner)
            return StreamingResponse(
                self.events(job_id, _base(request)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )

        @router.get("/assets/{asset}/content", summary="Comfy API v2: an output's bytes")
        async def content(
            asset: str,
            authorization: Authorization = None,
            range: Annotated[str | None, Header()] = None,
        ) -> Response:
            owner = self._owner(authorization)
            return await self.content(asset, owner, range)

        self._asset_routes(router)
        return router

    def _asset_routes(self, router: APIRouter) -> None:
        """The upload side: ``HEAD by-hash``, ``from-hash``, multipart ``POST``, a record."""
        assets = self.assets

        @router.head("/assets/by-hash/{digest}", summary="Comfy API v2: have these bytes?")
        async def by_hash(digest: str, authorization: Authorization = None) -> Response:
            owner = self._owner(authorization)
            known = await assets.known(digest, _backend(owner))
            return Response(status_code=200 if known else 404)

        @router.post("/assets/from-hash", summary="Comfy API v2: an asset of known bytes")
        async def from_hash(request: Request, authorization: Authorization = None) -> Any:
            owner = self._owner(authorization)
            record = await assets.from_hash(request, _backend(owner))
            return assets.view(record, _base(request), created_new=False)

        @router.post("/assets", summary="Comfy API v2: upload an input (multipart)")
        async def upload(request: Request, authorization: Authorization = None) -> JSONResponse:
            owner = self._owner(authorization)  # before a byte of the body is read
            record, new = await assets.upload(request, _backend(owner))
            return JSONResponse(assets.view(record, _base(request), new), 201 if new else 200)

        @router.get("/assets/{asset}", summary="Comfy API v2: an asset (upload or output)")
        async def get_asset(
            asset: str, request: Request, authorization: Authorization = None
        ) -> Any:
            owner = self._owner(authorization)
            if parse_asset_id(asset) is not None:
                return await self._output_asset(asset, owner, _base(request))
            record = await assets.record(asset, functools.partial(_reads, owner))
            if record is None:
                raise V2Error(404, "asset_not_found", f"no asset {asset!r}")
            return assets.view(record, _base(request), None)

        @router.delete("/assets/{asset}", status_code=204, summary="Comfy API v2: delete an asset")
        async def delete_asset(asset: str, authorization: Authorization = None) -> Response:
            owner = self._owner(authorization)
            await assets.delete(asset, functools.partial(_reads, owner))
            return Response(status_code=204)

    async def _output_asset(self, value: str, owner: Principal, base: str) -> dict[str, Any]:
        """A job's output as an ``Asset`` (``GET /assets/{id}`` of an output's id)."""
        parsed = parse_asset_id(value)
        task = None if parsed is None else await self.rt.store.reads.get(parsed[0])
        if task is None or not _reads(owner, task.backend_id):
            raise V2Error(404, "asset_not_found", f"no asset {value!r}")
        job = await self.job(task, base)
        output = next((o for o in job["outputs"] if o["id"] == value), None)
        if output is None:
            raise V2Error(404, "asset_not_found", f"no asset {value!r}")
        return {
            "id": value,
            "hash": output["hash"],
            "size_bytes": output["size_bytes"],
            "content_type": output["content_type"],
            "file_path": output["name"],
            "created_at": job["completed_at"],
            "url": output["url"],
            "url_expires_at": output["url_expires_at"],
            "expires_at": job["expires_at"],
            "job_id": task.task_id,
        }

    def bridge_router(self) -> APIRouter:
        """``GET /api/inputs/blake3:<hex>``: a job's uploaded input, for the bridge that runs
        it (bridge token)."""
        router = APIRouter(prefix="/api", tags=["api"])

        @router.get("/inputs/{digest}", summary="An uploaded workflow input (bridges)")
        async def bridge_input(digest: str, authorization: Authorization = None) -> Response:
            if not self.gw.auth.bridge(bearer(authorization)):
                raise V2Error(401, "unauthorized", "a bridge token is required")
            return await self.assets.for_bridge(digest)

        return router


# -- helpers ------------------------------------------------------------------------------


def _backend(principal: Principal) -> str:
    """The backendId a job is submitted for: the token's ``sub``, else the first id it
    names, else :data:`ANONYMOUS` (static and admin tokens, a JWT naming no id)."""
    if principal.sub:
        return principal.sub
    return min(principal.ids) if principal.ids else ANONYMOUS


def _reads(principal: Principal, backend_id: str) -> bool:
    """Whether the token sees (and may cancel) the jobs of ``backend_id``."""
    if principal.ids is None or backend_id in principal.ids:
        return True
    return not principal.ids and backend_id == ANONYMOUS


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _graph(task: Task) -> dict[str, Any] | None:
    graph = task.payload.get("workflow")
    if isinstance(graph, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            graph = orjson.loads(graph)
    return graph if isinstance(graph, dict) else None


def _metadata(task: Task) -> dict[str, str]:
    labels = task.payload.get("metadata")
    if not isinstance(labels, dict):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def _job_error(task: Task) -> dict[str, Any]:
    failure = task.failure or {"code": "", "message": ""}
    code = failure.get("code") or "failed"
    return {"code": code, "message": failure.get("message") or code}


def _summary(task: Task, labels: dict[str, str]) -> dict[str, Any]:
    status = STATUS[task.state]
    return {
        "id": task.task_id,
        "status": status,
        "create_time": _iso(task.created_at),
        "update_time": _iso(task.updated_at),
        "created_at": _iso(task.created_at),
        "metadata": labels,
    }


def _is_step(message: dict[str, Any]) -> bool:
    """A bridge's TASK_PROGRESS (not the ``running`` notice nor an end)."""
    return "value" in message and message.get("state") is None


def _log_of(message: dict[str, Any], live: Live | None) -> dict[str, str] | None:
    """A ``log`` event from what the bridge reported: a node starting (a step naming
    another node than the last one heard)."""
    node = message.get("node")
    if not _is_step(message) or not isinstance(node, str) or (live and live.node == node):
        return None
    name = message.get("nodeName")
    return {"level": "info", "message": f"node {node}" + (f" ({name})" if name else "") + " runs"}


def _end_log(job: dict[str, Any]) -> dict[str, str]:
    error = job["error"]
    if error is not None:
        message = f"{job['status']}: {error['code']}: {error['message']}"
        return {"level": "error", "message": message}
    outputs = len(job["outputs"])
    message = f"{job['status']}: {outputs} outputs" if outputs else str(job["status"])
    return {"level": "info", "message": message}


def _status_frames(job: dict[str, Any]) -> list[bytes]:
    """The frames of a status change: a terminal one after the job's outputs and a ``log``
    of how it ended."""
    frames = []
    if job["status"] in TERMINAL:
        frames += [_sse("output", output) for output in job["outputs"]]
        frames.append(_sse("log", _end_log(job)))
    if job["progress"] is not None and job["status"] in ("running", "succeeded"):
        frames.append(_sse("progress", job["progress"]))
    status = {"status": job["status"], "queue_position": job["queue_position"]}
    return [*frames, _sse("status", status)]


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _base(request: Request) -> str:
    """This server's origin as the caller reached it (outputs' ``url`` must be absolute)."""
    return str(request.base_url).rstrip("/")


async def _body(request: Request, limit: int) -> bytes:
    try:
        return await bounded_body(request, limit)
    except ClientError as exc:
        raise _from_client_error(exc) from exc


def _list_query(request: Request) -> tuple[dict[str, str], int, int]:
    filters: dict[str, str] = {}
    limit, cursor = DEFAULT_LIST_LIMIT, 0
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata[") and name.endswith("]"):
            filters[name[len("metadata[") : -1]] = value
        elif name == "limit":
            if not value.isdigit() or not 1 <= int(value) <= MAX_LIST_LIMIT:
                raise V2Error(422, "invalid_request", f"limit: 1 to {MAX_LIST_LIMIT}")
            limit = int(value)
        elif name == "cursor":
            if not value.isdigit():
                raise V2Error(422, "invalid_cursor", "cursor: a value this server handed out")
            cursor = int(value)
    if len(filters) > MAX_METADATA_PAIRS:
        raise V2Error(422, "invalid_metadata_filter", f"at most {MAX_METADATA_PAIRS} filters")
    return filters, limit, cursor
