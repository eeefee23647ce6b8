"""JimuAI (即梦, sold through Volcengine's visual API) adapter: a polling platform.

Submit: ``POST {base}/?Action=CVSync2AsyncSubmitTask&Version=2022-08-31`` with the client's
payload as the body (``req_key`` from model.json when the payload has none), answered with
``data.task_id``. Poll: ``Action=CVSync2AsyncGetResult`` with ``{req_key, task_id,
req_json: '{"return_url":true}'}`` until ``data.status`` is ``done``. Every request carries
Volcengine's HMAC-SHA256 signature (:mod:`aigcq.wire.volc_sign`).

A result's ``fileType``: an image URL's path extension where it names an image type, else
``jpeg``, the format Volcengine documents for ``image_urls`` (doc 85621/1616429); an inline
image's is read from its first bytes.

Credentials come per AIGC project from model.json (``access_key``, ``secret_key``,
``region``, ``req_key``); :class:`aigcq.config.JimuAIAccount` packs them into the account's
``apikey`` string, the one credential the adapter interface passes around.

What each answer means (Volcengine docs 85621 / 6444 "业务错误码", 6369/68677 "公共错误码"):

======================================  ===========================  ======================
answer                                  on submit                    on get-result
======================================  ===========================  ======================
code 10000                              Accepted(task_id)            by ``data.status``
status in_queue / generating            -                            Pending
status done + image_urls / video_url    -                            Succeeded(fileUrl list)
status done + binary_data_base64 only   -                            Succeeded(files: stored)
status not_found                        -                            Failed (not sent again)
status expired                          -                            Failed
50429 QPS limit, 50430 concurrency      Full (back off)              Unknown (ask later)
50500 / 50501 internal                  Rejected, retryable          Failed
50511/50516/50517/50519 post-review     Rejected, retryable          Failed, retryable
other 504xx/505xx (input review, ...)   Rejected                     Failed
gateway FlowLimitExceeded / HTTP 429    Full                         Unknown
gateway InternalError/Timeout/5xx       Rejected, retryable          Unknown
gateway signature/key/permission        Rejected                     Unknown
anything else / unreadable              Uncertain (2xx) / by HTTP    Unknown
======================================  ===========================  ======================

There is no remote cancel: a task we no longer want runs to its end on the platform, counted
in its account's cap as an orphan (:mod:`aigcq.scheduler.orphans`) until it ends there.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

from aigcq.config import JimuAIAccount
from aigcq.domain import Task
from aigcq.platforms import base
from aigcq.platforms._parse import as_int, unreadable_create
from aigcq.platforms.registry import PlatformSpec, register
from aigcq.wire.volc_sign import Credentials, sign

DEFAULT_URL = "https://visual.volcengineapi.com"
VERSION = "2022-08-31"
SUBMIT_ACTION = "CVSync2AsyncSubmitTask"
RESULT_ACTION = "CVSync2AsyncGetResult"
DEFAULT_REGION = "cn-north-1"
SERVICE = "cv"
SUCCESS = 10000
#: QPS limit and concurrency limit ("Request Has Reached API (Concurrent) Limit")
FULL_CODES = frozenset({50429, 50430})
#: the output (post-generation) reviews, documented as worth retrying ("可重试"): they come
#: on get-result, once the images exist; a new generation may pass
POST_REVIEW_CODES = frozenset({50511, 50516, 50517, 50519})
#: a refused create retried: internal errors and the output reviews
RETRYABLE_CODES = frozenset({50500, 50501}) | POST_REVIEW_CODES
#: gateway (ResponseMetadata.Error) codes: throttled, and transient service trouble
GATEWAY_FULL = frozenset({"FlowLimitExceeded"})
GATEWAY_TRANSIENT = frozenset(
    {"InternalError", "InternalServiceTimeout", "ServiceUnavailableTemp", "InternalServiceError"}
)
RETURN_URL = json.dumps({"return_url": True}, separators=(",", ":"))
#: models that may make several images per create (each one billed), and their limit on
#: input plus output images: 即梦 4.0 makes up to 15 minus its inputs unless its
#: ``force_single`` flag says one (doc 85621/1616429). Any other model: one image.
MULTI_OUTPUT = {"jimeng_t2i_v40": 15}
#: the input images of a create
INPUT_FIELDS = ("image_urls", "binary_data_base64")


def most_outputs(body: dict[str, Any]) -> int:
    """The most images (each one billed) a create with ``body`` may make."""
    limit = MULTI_OUTPUT.get(str(body.get("req_key")))
    if limit is None or body.get("force_single") is True:
        return 1
    inputs = sum(len(v) for f in INPUT_FIELDS if isinstance(v := body.get(f), list))
    return max(limit - inputs, 1)


@dataclass(frozen=True, slots=True)
class JimuCredentials:
    """One project's JimuAI account, as packed into ``PlatformAccount.apikey``."""

    access_key: str
    secret_key: str
    region: str = DEFAULT_REGION
    req_key: str = ""
    #: the project's maximum of output images per task (None: the vendor's)
    max_outputs: int | None = None

    def __repr__(self) -> str:  # never print the secret key
        return f"JimuCredentials(access_key={self.access_key!r}, region={self.region!r})"

    def pack(self) -> str:
        return json.dumps(
            {
                "access_key": self.access_key,
                "secret_key": self.secret_key,
                "region": self.region,
                "req_key": self.req_key,
                "max_outputs": self.max_outputs,
            },
            separators=(",", ":"),
        )

    @classmethod
    def unpack(cls, apikey: str) -> JimuCredentials:
        """From the packed form; a bare ``apikey`` (no JSON) yields unusable credentials
        that the platform refuses, as it would any wrong key."""
        try:
            raw = json.loads(apikey)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return cls("", "")
        cap = raw.get("max_outputs")
        return cls(
            str(raw.get("access_key") or ""),
            str(raw.get("secret_key") or ""),
            str(raw.get("region") or DEFAULT_REGION),
            str(raw.get("req_key") or ""),
            cap if isinstance(cap, int) and not isinstance(cap, bool) else None,
        )


def gateway_error(body: Any) -> dict[str, Any] | None:
    """``ResponseMetadata.Error`` of a gateway error reply (signature, throttling, ...)."""
    if not isinstance(body, dict):
        return None
    meta = body.get("ResponseMetadata")
    error = meta.get("Error") if isinstance(meta, dict) else None
    return error if isinstance(error, dict) and error.get("Code") else None


def _code_message(body: dict[str, Any]) -> tuple[int | None, str]:
    return as_int(body.get("code")), str(body.get("message") or "")


def _detail(body: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": body.get("request_id", ""), "code": body.get("code")}


def files_result(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the client receives: RunningHub's ``/outputs`` shape, so a client reads a
    JimuAI result exactly as a ComfyUI one."""
    return {"code": 0, "msg": "success", "data": entries}


#: image types by file name extension; JimuAI documents its images as JPEG
IMAGE_TYPES = {"jpeg": "jpeg", "jpg": "jpg", "png": "png", "webp": "webp"}
DOCUMENTED_TYPE = "jpeg"
#: how each image type's files begin
MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"RIFF", "webp"))


def url_type(url: str) -> str:
    """An image URL's type: its path's extension when that names an image type, else the
    documented JPEG (a signed link's path need not end in one)."""
    ext = PurePosixPath(urlsplit(url).path).suffix.lower().lstrip(".")
    return IMAGE_TYPES.get(ext, DOCUMENTED_TYPE)


def content_type(data: bytes) -> str:
    """An inline image's type, by its first bytes (else the documented JPEG)."""
    for magic, kind in MAGIC:
        if data.startswith(magic) and (kind != "webp" or data[8:12] == b"WEBP"):
            return kind
    return DOCUMENTED_TYPE


def _result_files(task_data: dict[str, Any]) -> base.ResultOutcome:
    """A ``done`` task's outputs: URLs as they are, base64 images as files to store."""
    urls = task_data.get("image_urls")
    entries: list[dict[str, Any]] = []
    if isinstance(urls, list):
        entries += [
            {"fileUrl": u, "fileType": url_type(u)} for u in urls if isinstance(u, str) and u
        ]
    video = task_data.get("video_url")
    if isinstance(video, str) and video:
        entries.append({"fileUrl": video, "fileType": "mp4"})
    if entries:
        return base.Succeeded(files_result(entries), cost=base.Cost(units=len(entries)))
    blobs = task_data.get("binary_data_base64")
    files: list[base.ResultFile] = []
    if isinstance(blobs, list):
        for i, blob in enumerate(blobs):
            if not isinstance(blob, str):
                continue
            try:
                data = base64.b64decode(blob, validate=True)
            except (binascii.Error, ValueError):
                return base.Unknown("done, but binary_data_base64 is not valid base64")
            kind = content_type(data)
            files.append(base.ResultFile(f"{i}.{kind}", data, f"image/{kind}"))
    if files:
        cost = base.Cost(units=len(files))
        return base.Succeeded(files_result([]), files=tuple(files), cost=cost)
    return _failed("JIMUAI_EMPTY_RESULT", "done without image_urls, video_url or images")


def _failed(code: str, message: str, body: Any = None, *, retryable: bool = False) -> base.Failed:
    """A failure, billed nothing: JimuAI bills the output images it delivers."""
    detail = _detail(body) if isinstance(body, dict) else None
    return base.Failed(code, message, detail, retryable, cost=base.Cost(units=0))


class JimuAIAdapter(base.PlatformAdapter):
    name = "jimuai"
    kind = "polling"
    serves = ("jimuai",)

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url or DEFAULT_URL)
        parts = urlsplit(self.base_url)
        self._host = parts.netloc
        self._path = parts.path or "/"

    def _request(self, action: str, apikey: str, body: dict[str, Any]) -> base.HttpRequest:
        creds = JimuCredentials.unpack(apikey)
        query = {"Action": action, "Version": VERSION}
        raw = orjson.dumps(body)
        headers = sign(
            Credentials(creds.access_key, creds.secret_key, creds.region, SERVICE),
            method="POST",
            host=self._host,
            path=self._path,
            query=query,
            body=raw,
        )
        slash = "/" if self._path == "/" else ""
        url = f"{self.base_url}{slash}?{urlencode(query)}"
        return base.HttpRequest("POST", url, headers, body=raw)

    @staticmethod
    def _req_key(task: Task, apikey: str) -> str:
        """The payload's ``req_key``, else the account's. An orphan (a remote task we no
        longer want, checked until it ends) has no payload: it carries the payload's
        ``req_key`` as its ``workflow_id``."""
        given = task.payload.get("req_key") or task.workflow_id
        return str(given) if given else JimuCredentials.unpack(apikey).req_key

    def _submit_body(self, task: Task, apikey: str) -> dict[str, Any]:
        """The payload with its ``req_key``; ``force_single`` when the create might make
        more images than the project's ``max_outputs`` (the API's one bound on them)."""
        body = {**task.payload, "req_key": self._req_key(task, apikey)}
        cap = JimuCredentials.unpack(apikey).max_outputs
        if cap is not None and most_outputs(body) > cap:
            body["force_single"] = True
        return body

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> base.HttpRequest:
        return self._request(SUBMIT_ACTION, apikey, self._submit_body(task, apikey))

    def account_id(self, apikey: str) -> str:
        """The access key: Volcengine's public name of the account (its secret is the
        secret key)."""
        return JimuCredentials.unpack(apikey).access_key

    def workflow_of(self, workflow_id: str, apikey: str) -> str:
        """The payload's ``req_key``, else the account's."""
        return workflow_id or JimuCredentials.unpack(apikey).req_key

    def billed_units(self, task: Task, apikey: str) -> int:
        """JimuAI bills per output image: the most the create may make."""
        return most_outputs(self._submit_body(task, apikey))

    def parse_submit(self, status: int, body: Any) -> base.SubmitOutcome:
        if (error := gateway_error(body)) is not None:
            name = str(error.get("Code"))
            text = str(error.get("Message") or "")
            if name in GATEWAY_FULL or status == 429:
                return base.Full(f"JIMUAI_{name}")
            retryable = name in GATEWAY_TRANSIENT or status >= 500
            return base.Rejected(f"JIMUAI_{name}", text, retryable=retryable, detail=error)
        if not isinstance(body, dict) or (code_msg := _code_message(body))[0] is None:
            # any reply we cannot read may have created a (paid) task: never re-send it blindly
            return unreadable_create(status)
        code, message = code_msg
        if code == SUCCESS:
            data = body.get("data")
            task_id = data.get("task_id") if isinstance(data, dict) else None
            if task_id in (None, ""):
                return base.Uncertain("success without task_id")
            return base.Accepted(str(task_id))
        if code in FULL_CODES:
            return base.Full(f"JIMUAI_{code} {message}".rstrip())
        # Any other code: documented as "no task_id", so nothing was created or billed.
        return base.Rejected(
            f"JIMUAI_{code}", message, retryable=code in RETRYABLE_CODES, detail=_detail(body)
        )

    def query_request(self, task: Task, apikey: str) -> base.HttpRequest:
        body = {
            "req_key": self._req_key(task, apikey),
            "task_id": task.remote_id,
            "req_json": RETURN_URL,
        }
        return self._request(RESULT_ACTION, apikey, body)

    def parse_query(self, status: int, body: Any) -> base.ResultOutcome:
        if (error := gateway_error(body)) is not None:
            return base.Unknown(f"gateway error {error.get('Code')} (HTTP {status})")
        if not isinstance(body, dict) or (code_msg := _code_message(body))[0] is None:
            return base.Unknown(f"unreadable reply (HTTP {status})")
        code, message = code_msg
        if code in FULL_CODES:
            return base.Unknown(f"JIMUAI_{code} rate limited")
        if code != SUCCESS:
            return _failed(
                f"JIMUAI_{code}",
                message or "task failed",
                body,
                retryable=code in POST_REVIEW_CODES,
            )
        data = body.get("data")
        state = str(data.get("status") or "") if isinstance(data, dict) else ""
        match state:
            case "in_queue" | "generating":
                return base.Pending(state)
            case "done":
                assert isinstance(data, dict)
                return _result_files(data)
            case "not_found":
                # a task it accepted and does not know: a new create would be billed and
                # most likely lost the same way (another account, a req_key it was not
                # made with), so the task fails at once rather than be paid again
                message = "task not found on JimuAI (unknown, or older than 12 h)"
                return _failed("JIMUAI_NOT_FOUND", message, body)
            case "expired":
                return _failed("JIMUAI_EXPIRED", "task expired on JimuAI", body)
            case _:
                return base.Unknown(f"undocumented status {state!r}")


SPEC = register(
    PlatformSpec(
        JimuAIAdapter,
        url=DEFAULT_URL,
        workflow_field="req_key",
        account=JimuAIAccount,
        cost=("units",),
        expiring_links=True,
        emulator="jimuai",
    )
)
