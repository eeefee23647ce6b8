"""Comfy API v2 as a paid target (polling): Comfy Cloud, a Comfy serverless deployment, or
any ``comfy-api-proxy`` in front of a ComfyUI. It takes a ``comfyui`` task's API-format
graph as it is (the payload's inline ``workflow``): same-dialect overflow, no RunningHub
workflow id needed.

Opt-in: it exists, and takes the ``comfyui`` queues' overflow from RunningHub, only when
its base URL is configured (``AIGCQ_PLATFORM_URLS='{"comfy_v2": "https://…"}'``); the
account's ``apikey`` in model.json is sent as ``Authorization: Bearer``.

Paid at most once: every create carries an ``Idempotency-Key`` derived from the task and
its attempt, and ``metadata`` naming both (an object of labels for Comfy's hosted API, one
string for a ``comfy-api-proxy``, which takes no other). The v2 key is single-use, so a create sent
again for the same attempt can never make a second job: one whose answer was lost is sent
once more at once (``resend_same_attempt``); a ``422 idempotency_key_reuse`` is read as the
attempt's job (its id from the error's ``details`` where the server gives it, as aigcq's
own v2 door does; else the outcome stays unknown and the task is never created twice).
``429`` (``queue_full``) and ``402`` (``insufficient_credits``) are the account's
backpressure and balance: nothing was made, it waits. Results are the job's outputs
(``url``, absolute, valid until ``url_expires_at``) in RunningHub's result shape.
"""

from __future__ import annotations

import posixpath
from typing import Any, ClassVar
from urllib.parse import quote, urlencode, urlsplit

import orjson

from aigcq.domain import Task
from aigcq.platforms import base
from aigcq.platforms._parse import unreadable_create
from aigcq.platforms.registry import PlatformSpec, register
from aigcq.wire.assets import has_assets

#: errors that say the job itself is wrong: sending it again cannot help
_INVALID = frozenset({"invalid_workflow", "workflow_format_ui", "missing_asset", "not_found"})
#: errors that say nothing was created and the account may take it later
_WAIT = frozenset({"queue_full", "insufficient_credits", "deployment_not_ready"})
_PENDING = frozenset({"queued", "running", "canceling"})


def idempotency_key(task: Task) -> str:
    """The create's key: one per task and attempt (a v2 key is 1-255 printable ASCII)."""
    return f"aigcq-{task.task_id}-{task.attempt}"[:255]


def labels(task: Task) -> dict[str, str]:
    """The ``metadata`` a create carries: which task and attempt the job is."""
    return {"aigcq_task": task.task_id, "aigcq_attempt": str(task.attempt)}


def label_text(task: Task) -> str:
    """The same as one opaque string: ``comfy-api-proxy`` 0.1.6 takes ``metadata`` only as
    a string (an object is ``422 invalid_request``), where Comfy's hosted API (and
    ``comfy-sdk``) send an object of string labels."""
    return "&".join(f"{k}={v}" for k, v in labels(task).items())


def hosted(base_url: str) -> bool:
    """Comfy's hosted API (Comfy Cloud, serverless deployments under ``comfy.org``)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "comfy.org" or host.endswith(".comfy.org")


def _graph(task: Task) -> Any:
    graph = task.payload.get("workflow")
    if isinstance(graph, str):
        try:
            return orjson.loads(graph)
        except orjson.JSONDecodeError:
            return graph
    return graph


def _error(body: Any) -> tuple[str, str, dict[str, Any]]:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", "", {}
    details = error.get("details")
    return (
        str(error.get("code") or ""),
        str(error.get("message") or ""),
        details if isinstance(details, dict) else {},
    )


def _file(output: dict[str, Any]) -> dict[str, Any]:
    name = str(output.get("name") or posixpath.basename(urlsplit(str(output["url"])).path))
    entry = {
        "fileUrl": str(output["url"]),
        "fileType": name.rsplit(".", 1)[-1].lower() if "." in name else "",
        "nodeId": str(output.get("node_id") or ""),
        "fileName": name,
    }
    for field in ("size_bytes", "hash", "url_expires_at", "content_type"):
        if output.get(field) is not None:
            entry[field] = output[field]
    return entry


class ComfyV2Adapter(base.PlatformAdapter):
    name = "comfy_v2"
    kind = "polling"
    serves: ClassVar[tuple[str, ...]] = ("comfyui",)
    opt_in = True
    resend_same_attempt = True

    def _url(self, path: str) -> str:
        return f"{self.base_url}/api/v2{path}"

    @staticmethod
    def _headers(apikey: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if apikey:
            headers["Authorization"] = f"Bearer {apikey}"
        return headers

    def unsendable(self, task: Task) -> str | None:
        graph = _graph(task)
        if not isinstance(graph, dict):
            return "comfy_v2 takes an inline API-format workflow; this task names a workflowId"
        if has_assets(graph):  # aigcq's uploaded inputs: not (yet) uploaded there
            return "comfy_v2: the graph names inputs uploaded to aigcq (core/ASSET)"
        return None

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> base.HttpRequest:
        headers = self._headers(apikey) | {"Idempotency-Key": idempotency_key(task)}
        metadata = labels(task) if hosted(self.base_url) else label_text(task)
        body = {"workflow": _graph(task), "metadata": metadata}
        return base.HttpRequest("POST", self._url("/jobs"), headers, body)

    def parse_submit(self, status: int, body: Any) -> base.SubmitOutcome:
        if status == 201 and isinstance(body, dict) and isinstance(body.get("id"), str):
            return base.Accepted(body["id"])
        code, message, details = _error(body)
        if code == "idempotency_key_reuse":  # this attempt's create went through before
            job = details.get("job_id") or details.get("existing_job_id")
            if isinstance(job, str) and job:
                return base.Accepted(job)
            return base.Uncertain("its key was used: the job exists, its id is not told")
        if status == 429 or code in _WAIT or status == 402:
            return base.Full(f"COMFY_V2 {code or status} {message}".rstrip())
        if code in _INVALID or (code and 400 <= status < 500 and status not in (408, 409)):
            return base.Rejected(f"COMFY_V2_{code}", message or code, detail=details or None)
        return unreadable_create(status)

    def lookup_request(self, task: Task, apikey: str) -> base.HttpRequest | None:
        """``GET /jobs?metadata[aigcq_task]=…&metadata[aigcq_attempt]=…`` on Comfy's hosted
        API, which keeps labels (a proxy keeps none: nothing to ask)."""
        if not hosted(self.base_url):
            return None
        query = urlencode(
            [*((f"metadata[{k}]", v) for k, v in labels(task).items()), ("limit", "10")]
        )
        return base.HttpRequest("GET", self._url(f"/jobs?{query}"), self._headers(apikey))

    def parse_lookup(self, status: int, body: Any) -> str | None:
        jobs = body.get("jobs") if status == 200 and isinstance(body, dict) else None
        found = [
            j["id"] for j in jobs or [] if isinstance(j, dict) and isinstance(j.get("id"), str)
        ]
        return found[0] if len(found) == 1 else None

    def query_request(self, task: Task, apikey: str) -> base.HttpRequest:
        return base.HttpRequest(
            "GET", self._url(f"/jobs/{quote(task.remote_id, safe='')}"), self._headers(apikey)
        )

    def parse_query(self, status: int, body: Any) -> base.ResultOutcome:
        if status == 404:
            return base.NotFound(_error(body)[1] or "no such job")
        if status != 200 or not isinstance(body, dict):
            return base.Unknown(f"COMFY_V2: no valid reply (HTTP {status})")
        state = str(body.get("status") or "")
        if state in _PENDING:
            return base.Pending(state)
        if state == "succeeded":
            outputs = body.get("outputs")
            files = [
                _file(o)
                for o in (outputs if isinstance(outputs, list) else [])
                if isinstance(o, dict) and o.get("url")
            ]
            return base.Succeeded({"code": 0, "msg": "success", "data": files})
        if state == "failed":
            found = body.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            code = str(error.get("code") or "failed")
            return base.Failed(f"COMFY_V2_{code}", str(error.get("message") or code), error)
        if state == "canceled":
            return base.Failed("COMFY_V2_canceled", "the job was canceled on the platform")
        if state == "expired":  # made (and billed); or comfy-api-proxy's race between its
            # /history and /queue reads on a job ending then: never "gone", ask again
            return base.Unknown("COMFY_V2: the job reads expired")
        return base.Unknown(f"COMFY_V2: unknown status {state!r}")

    def cancel_request(self, task: Task, apikey: str) -> base.HttpRequest | None:
        if not task.remote_id:
            return None
        url = self._url(f"/jobs/{quote(task.remote_id, safe='')}/cancel")
        return base.HttpRequest("POST", url, self._headers(apikey))


SPEC = register(
    PlatformSpec(ComfyV2Adapter, cost=("units",), expiring_links=True, emulator="comfyui")
)
