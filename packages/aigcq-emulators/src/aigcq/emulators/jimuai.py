"""JimuAI (即梦 on Volcengine's visual API) emulator: the two async actions as a real server.

``POST /?Action=CVSync2AsyncSubmitTask&Version=2022-08-31`` and
``POST /?Action=CVSync2AsyncGetResult&Version=2022-08-31``, each signed with Volcengine's
HMAC-SHA256 signature and checked as the gateway checks it: a missing ``X-Date`` is
``MissingRequestInfo``, an ``X-Date`` outside ``max_skew_s`` ``InvalidTimestamp``, an
unknown access key ``InvalidAccessKey``, and a wrong signature or a body that does not match
the signed one ``SignatureDoesNotMatch`` — in the gateway's ``ResponseMetadata.Error``
shape (Volcengine doc 6369/68677). The vendor's SDK (``volcengine.visual.VisualService``
with ``set_host`` / ``set_scheme("http")``) works against it.

A task is ``in_queue`` for ``queue_s``, ``generating`` for ``duration_s``, then ``done``
with a real JPEG (the documented output format): as ``image_urls`` when ``req_json`` asks
``return_url``, else (or always, with ``base64_only``) as ``binary_data_base64``. Business
errors use the documented codes and HTTP statuses: ``50429`` (QPS, ``qps`` per key),
``50430`` (more than ``max_concurrent`` tasks in_queue or generating per key), ``50500``
(internal; the fate of ``failure_rate`` of the tasks). ``POST /_emulator/inject {"kind",
"count"}`` makes the next ``count`` answers ``rate_limit`` / ``concurrency`` / ``internal``
(submits) or ``not_found`` / ``expired`` / ``result_rate_limit`` / ``post_review`` (a done
task's get-result: ``50511``, its output failed the post-generation review) (get-results);
``clear`` drops them.
``GET /_emulator/stats`` reports submits, polls, running, the peak of running tasks and
how often each prompt was created (``duplicates``).

An image URL is a signed link that carries its expiry (``?x-expires=<epoch s>&x-signature=…``,
``file_ttl_s`` after it was first handed out) and answers 403 once expired, or once expired
on demand (``POST /_emulator/files``).
"""

from __future__ import annotations

import base64
import time
import zlib
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from aigcq.emulators._common import (
    EmulatorConfig,
    EmulatorCore,
    add_common_routes,
    result_colour,
)
from aigcq.emulators._http import read_json, reply, run_app
from aigcq.emulators.jpeg import solid_jpeg
from aigcq.plumbing.signing import same_digest
from aigcq.wire.volc_sign import (
    DATE_FORMAT,
    canonical_request,
    parse_authorization,
    sha256_hex,
    signature,
)

VERSION = "2022-08-31"
SUBMIT, GET_RESULT = "CVSync2AsyncSubmitTask", "CVSync2AsyncGetResult"
SERVICE = "cv"
DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY = "AKLTemulator", "emulator-secret"

# gateway errors: (Code, CodeN, HTTP status, Message) — doc 6369/68677
MISSING_PARAMETER = ("MissingParameter", 100002, 400, "The request is missing {} parameter.")
MISSING_INFO = ("MissingRequestInfo", 100004, 400, "The request is missing {} information.")
INVALID_TIMESTAMP = ("InvalidTimestamp", 100006, 400, "The Signature of the request is expired.")
INVALID_ACTION = (
    "InvalidActionOrVersion",
    100008,
    404,
    "Could not find operation {} for version {}.",
)
INVALID_ACCESS_KEY = (
    "InvalidAccessKey",
    100009,
    401,
    "The accesskey [{}] included in the request is invalid.",
)
SIGNATURE_MISMATCH = (
    "SignatureDoesNotMatch",
    100010,
    401,
    "The request signature we calculated does not match the signature you provided. "
    "Check your Secret Access Key and signing method. "
    "Consult the service documentation for details.",
)

# business errors: (code, HTTP status, message) — the JimuAI docs' 业务错误码
INVALID_INPUT = (50215, 400, "Input invalid for this service.")
RATE_LIMIT = (50429, 429, "Request Has Reached API Limit, Please Try Later")
CONCURRENCY_LIMIT = (50430, 429, "Request Has Reached API Concurrent Limit, Please Try Later")
INTERNAL_ERROR = (50500, 500, "Internal Error")
POST_REVIEW = (50511, 400, "Post Img Risk Not Pass")
#: input plus output images of one create at most (即梦 4.0)
MAX_IMAGES = 15
SUBMIT_INJECTIONS = {
    "rate_limit": RATE_LIMIT,
    "concurrency": CONCURRENCY_LIMIT,
    "internal": INTERNAL_ERROR,
}
RESULT_INJECTIONS = ("not_found", "expired", "result_rate_limit")
#: injected answers a done task's get-result gives instead of its images
DONE_INJECTIONS = {"post_review": POST_REVIEW}


@dataclass
class JimuAIEmulatorConfig(EmulatorConfig):
    """``credentials`` maps access keys to secret keys; ``max_concurrent`` tasks may be
    in_queue or generating per key; ``qps`` submits a second per key (0 = no limit);
    ``queue_s`` before ``generating``; ``max_skew_s`` how far ``X-Date`` may be from now;
    ``outputs`` the images a task makes (the model decides from the prompt, at most 15
    minus its input images, each one billed), one when its submit says ``force_single``."""

    credentials: Mapping[str, str] = field(
        default_factory=lambda: {DEFAULT_ACCESS_KEY: DEFAULT_SECRET_KEY}
    )
    region: str = "cn-north-1"
    max_concurrent: int = 5
    qps: float = 0.0
    queue_s: float = 0.0
    max_skew_s: float = 900.0
    base64_only: bool = False
    outputs: int = 1


class _Task:
    __slots__ = (
        "access_key",
        "done_at",
        "failed",
        "generating_at",
        "images",
        "prompt",
        "req_key",
    )

    def __init__(self, access_key: str, req_key: str, prompt: str, queue_s: float, run_s: float):
        now = time.monotonic()
        self.access_key, self.req_key, self.prompt = access_key, req_key, prompt
        self.generating_at = now + queue_s
        self.done_at = self.generating_at + run_s
        self.failed = False
        self.images = 1

    def state(self, now: float) -> str:
        if now >= self.done_at:
            return "done"
        return "generating" if now >= self.generating_at else "in_queue"


def _request_id() -> str:
    return (
        time.strftime("%Y%m%d%H%M%S")
        + zlib.crc32(str(time.time_ns()).encode()).__format__("08X")
        + "EMU"
    )


class _JimuAI(EmulatorCore):
    config: JimuAIEmulatorConfig
    file_name = "output.jpeg"
    signed_links = True  # [I] image_urls as signed CDN links that expire (x-expires)

    def __init__(self, config: JimuAIEmulatorConfig) -> None:
        super().__init__(config)
        self.tasks: dict[str, _Task] = {}
        self.active: dict[str, list[_Task]] = {}  # per access key, not yet done
        self.created_by_prompt: Counter[str] = Counter()
        self.injections: deque[str] = deque()
        self.peak = 0
        self._recent: dict[str, deque[float]] = {}  # submit times per key, for qps

    # ---- the gateway ------------------------------------------------------------------

    def _gateway_error(self, error: tuple[str, int, int, str], action: str, *args: str) -> Response:
        code, code_n, status, message = error
        self.counts[f"gateway_{code}"] += 1
        meta = {
            "RequestId": _request_id(),
            "Action": action,
            "Version": VERSION,
            "Service": SERVICE,
            "Region": self.config.region,
            "Error": {"CodeN": code_n, "Code": code, "Message": message.format(*args)},
        }
        return reply({"ResponseMetadata": meta}, status)

    def _authenticate(self, request: Request, action: str, body: bytes) -> Response | str:
        """The access key of a correctly signed request, or the gateway's error reply."""
        stamp = request.headers.get("x-date", "")
        if not stamp:
            return self._gateway_error(MISSING_INFO, action, "X-Date")
        try:
            signed_at = datetime.strptime(stamp, DATE_FORMAT).replace(tzinfo=UTC).timestamp()
        except ValueError:
            return self._gateway_error(INVALID_TIMESTAMP, action)
        if abs(time.time() - signed_at) > self.config.max_skew_s:
            return self._gateway_error(INVALID_TIMESTAMP, action)
        auth = parse_authorization(request.headers.get("authorization", ""))
        if auth is None:
            return self._gateway_error(MISSING_INFO, action, "Authorization")
        secret = self.config.credentials.get(auth.access_key)
        if secret is None:
            return self._gateway_error(INVALID_ACCESS_KEY, action, auth.access_key)
        body_hash = sha256_hex(body)
        claimed = request.headers.get("x-content-sha256")
        if claimed is not None and claimed != body_hash:
            return self._gateway_error(SIGNATURE_MISMATCH, action)
        headers = [(name, request.headers.get(name, "")) for name in auth.signed_headers]
        query = dict(request.query_params)
        canonical, _ = canonical_request(
            request.method, request.url.path, query, headers, body_hash
        )
        expected, scope = signature(secret, stamp, auth.region, auth.service, canonical)
        good_scope = scope == f"{auth.date}/{self.config.region}/{SERVICE}/request"
        if not (good_scope and same_digest(expected, auth.signature)):
            return self._gateway_error(SIGNATURE_MISMATCH, action)
        return auth.access_key

    async def handle(self, request: Request) -> Response:
        action = request.query_params.get("Action", "")
        version = request.query_params.get("Version", "")
        if not action or not version:
            return self._gateway_error(
                MISSING_PARAMETER, action, "Action" if not action else "Version"
            )
        if action not in (SUBMIT, GET_RESULT) or version != VERSION:
            return self._gateway_error(INVALID_ACTION, action, action, version)
        raw = await request.body()
        who = self._authenticate(request, action, raw)
        if isinstance(who, Response):
            return who
        self.remember_base(request)
        body = await read_json(request)
        if action == SUBMIT:
            return self._submit(who, body)
        return self._get_result(body)

    # ---- the two actions --------------------------------------------------------------

    def _business(self, error: tuple[int, int, str]) -> Response:
        code, status, message = error
        self.counts[f"code_{code}"] += 1
        return self._answer(code, None, message, status)

    @staticmethod
    def _answer(code: int, data: Any, message: str = "Success", status: int = 200) -> Response:
        body = {
            "code": code,
            "data": data,
            "message": message,
            "request_id": _request_id(),
            "status": code,
            "time_elapsed": "1.0ms",
        }
        return reply(body, status)

    def _running(self, access_key: str, now: float) -> list[_Task]:
        active = [t for t in self.active.get(access_key, []) if now < t.done_at]
        self.active[access_key] = active
        return active

    def _over_qps(self, access_key: str, now: float) -> bool:
        qps = self.config.qps
        if qps <= 0:
            return False
        recent = self._recent.setdefault(access_key, deque())
        while recent and recent[0] <= now - 1.0:
            recent.popleft()
        if len(recent) >= qps:
            return True
        recent.append(now)
        return False

    def _submit(self, access_key: str, body: Any) -> Response:
        self.counts["submits"] += 1
        if self.injections and self.injections[0] in SUBMIT_INJECTIONS:
            return self._business(SUBMIT_INJECTIONS[self.injections.popleft()])
        req_key = body.get("req_key") if isinstance(body, dict) else None
        if not isinstance(req_key, str) or not req_key:
            return self._business(INVALID_INPUT)
        prompt = body.get("prompt")
        images = body.get("image_urls") or body.get("binary_data_base64")
        if not (isinstance(prompt, str) and prompt) and not images:
            return self._business(INVALID_INPUT)
        now = time.monotonic()
        if self._over_qps(access_key, now):
            return self._business(RATE_LIMIT)
        running = self._running(access_key, now)
        if len(running) >= self.config.max_concurrent:
            return self._business(CONCURRENCY_LIMIT)
        task_id = self.new_id()
        task = _Task(
            access_key, req_key, str(prompt or ""), self.config.queue_s, self.config.duration_s
        )
        task.failed = self.draw_failure()
        task.images = self._images(body)
        self.tasks[task_id] = task
        running.append(task)
        self.peak = max(self.peak, len(running))
        self.counts["accepted"] += 1
        self.created_by_prompt[task.prompt] += 1
        for old in self.retention.expired(now):
            self.tasks.pop(old, None)
        self.retention.add(task.done_at, task_id)
        return self._answer(10000, {"task_id": task_id})

    def _images(self, body: dict[str, Any]) -> int:
        """How many images a create makes: one with ``force_single``, else ``outputs``,
        at most 15 minus its input images."""
        if body.get("force_single") is True:
            self.counts["force_single"] += 1
            return 1
        inputs = body.get("image_urls") or body.get("binary_data_base64") or []
        return max(1, min(self.config.outputs, MAX_IMAGES - len(inputs)))

    def _get_result(self, body: Any) -> Response:
        self.counts["polls"] += 1
        if not isinstance(body, dict):
            return self._business(INVALID_INPUT)
        req_key, task_id = body.get("req_key"), body.get("task_id")
        if not isinstance(req_key, str) or not req_key or not isinstance(task_id, str):
            return self._business(INVALID_INPUT)
        if self.injections and self.injections[0] in RESULT_INJECTIONS:
            kind = self.injections.popleft()
            if kind == "result_rate_limit":
                return self._business(RATE_LIMIT)
            return self._answer(10000, self._data(kind))
        task = self.tasks.get(task_id)
        if task is None or task.req_key != req_key:
            return self._answer(10000, self._data("not_found"))
        state = task.state(time.monotonic())
        if state != "done":
            return self._answer(10000, self._data(state))
        if task.failed:
            return self._business(INTERNAL_ERROR)
        if self.injections and self.injections[0] in DONE_INJECTIONS:
            return self._business(DONE_INJECTIONS[self.injections.popleft()])
        options = _req_json(body.get("req_json"))
        if options is None:
            return self._business(INVALID_INPUT)
        data = self._data("done")
        if options.get("return_url") is True and not self.config.base64_only:
            names = [f"output-{i}.jpeg" if i else "" for i in range(task.images)]
            data["image_urls"] = [self.file_url(task_id, name) for name in names]
        else:
            image = base64.b64encode(self.file_body(task_id)[0]).decode()
            data["binary_data_base64"] = [image] * task.images
        return self._answer(10000, data)

    @staticmethod
    def _data(status: str) -> dict[str, Any]:
        return {"binary_data_base64": None, "image_urls": None, "status": status}

    # ---- for tests and operators --------------------------------------------------------

    async def inject(self, request: Request) -> Response:
        body = await read_json(request)
        kind = body.get("kind") if isinstance(body, dict) else None
        count = body.get("count", 1) if isinstance(body, dict) else 0
        known = (*SUBMIT_INJECTIONS, *RESULT_INJECTIONS, *DONE_INJECTIONS, "clear")
        if kind not in known or not isinstance(count, int) or count < 0:
            return reply({"detail": f"kind must be one of {known}, count >= 0"}, 400)
        if kind == "clear":
            self.injections.clear()
        else:
            self.injections.extend([kind] * count)
        return reply({"queued": list(self.injections)})

    def file_body(self, item_id: str) -> tuple[bytes, str]:
        return solid_jpeg(result_colour(item_id)), "image/jpeg"

    def has_file(self, item_id: str) -> bool:
        task = self.tasks.get(item_id)
        return task is not None and time.monotonic() >= task.done_at and not task.failed

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            **self.counts,
            "running": sum(len(self._running(key, now)) for key in list(self.active)),
            "peak_running": self.peak,
            "duplicates": {p: n for p, n in self.created_by_prompt.items() if n > 1},
            "created": len(self.created_by_prompt),
        }


def _req_json(raw: Any) -> dict[str, Any] | None:
    """``req_json`` is a JSON *string* of an object (absent = {})."""
    if raw in (None, ""):
        return {}
    if not isinstance(raw, str):
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def create_app(config: JimuAIEmulatorConfig) -> FastAPI:
    """A JimuAI-compatible ASGI app (plus ``/files/...``, ``/_emulator/stats`` and
    ``/_emulator/inject``)."""
    emulator = _JimuAI(config)
    app = FastAPI(title="JimuAI emulator")
    app.add_route("/", emulator.handle, methods=["POST"])
    app.add_route("/_emulator/inject", emulator.inject, methods=["POST"])
    add_common_routes(app, emulator)
    return app


def run(host: str = "127.0.0.1", port: int = 9103, **options: Any) -> None:
    """Serve until interrupted; ``options`` are :class:`JimuAIEmulatorConfig` fields."""
    run_app(create_app(JimuAIEmulatorConfig(**options)), host, port)
