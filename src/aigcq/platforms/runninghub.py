"""RunningHub adapter (callback platform): the legacy ``/task/openapi/*`` API.

The task payload carries RunningHub's create fields (``workflowId``, ``nodeInfoList``,
``workflow``, ``instanceType``, ``addMetadata``, ...); we add ``apiKey`` and our own
``webhookUrl``. Results arrive as ``TASK_END`` webhooks whose ``eventData`` is the
``/outputs`` answer; a query of ``/outputs`` is parsed the same way, so a client sees one
result shape: ``{"code": 0, "msg": ..., "data": [{fileUrl, fileType, taskCostTime, nodeId}]}``
with ``taskCostTime`` as an int.

What a task cost comes in its output entries too: ``consumeCoins``, ``consumeMoney``,
``thirdPartyConsumeMoney`` (strings, or null) and ``taskCostTime``, as runninghub-sdk's
``TaskOutput`` reads them (a third party's client; the official Apifox pages show only
``taskCostTime``). They are the task's, repeated on each entry: the largest of each is
taken, and money is ``consumeMoney`` plus ``thirdPartyConsumeMoney``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import urlsplit

from aigcq.domain import Task
from aigcq.platforms import base
from aigcq.platforms._parse import as_amount, as_int, loads_if_json, unreadable_create
from aigcq.platforms.registry import PlatformSpec, register

#: success codes: 0 as documented; some deployments answer 200.
SUCCESS_CODES = frozenset({0, 200})
#: capacity: queue maxed, no dedicated instance, per-user cap, rate limit, model busy.
FULL_CODES = frozenset({421, 415, 1520, 1003, 1011})
#: transient server-side errors (plus any 5xx-looking code).
TRANSIENT_CODES = frozenset({500, 1005, 1010, 1012})
PENDING_CODES = {804: "RUNNING", 813: "QUEUED"}
TASK_FAILED = 805
NOT_FOUND_CODES = frozenset({807, 423})
#: payload fields we always set ourselves.
OWN_FIELDS = frozenset({"apiKey", "webhookUrl"})


def _normalized_outputs(body: dict[str, Any]) -> dict[str, Any]:
    """The success answer with ``taskCostTime`` as an int wherever it is numeric."""
    items = body.get("data")
    data = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "taskCostTime" in item:
            cost = as_int(item["taskCostTime"])
            item = {**item, "taskCostTime": item["taskCostTime"] if cost is None else cost}
        data.append(item)
    return {"code": 0, "msg": str(body.get("msg") or "success"), "data": data}


def _largest(entries: list[Any], field: str) -> float | None:
    found = [
        a for e in entries if isinstance(e, dict) and (a := as_amount(e.get(field))) is not None
    ]
    return max(found) if found else None


def _cost(entries: list[Any]) -> base.Cost:
    """A success's consumption, from its output entries (the task's, on each one)."""
    money = [_largest(entries, f) for f in ("consumeMoney", "thirdPartyConsumeMoney")]
    known = [m for m in money if m is not None]
    return base.Cost(
        money=round(sum(known), 6) if known else None,
        coins=_largest(entries, "consumeCoins"),
        seconds=_largest(entries, "taskCostTime"),
    )


def _is_output_list(data: Any) -> bool:
    """The documented shape of a success's ``data``: a list of output objects (or none)."""
    return data is None or (isinstance(data, list) and all(isinstance(i, dict) for i in data))


def _failed(body: dict[str, Any], msg: str) -> base.Failed:
    data = loads_if_json(body.get("data"))
    reason = loads_if_json(data.get("failedReason")) if isinstance(data, dict) else None
    message = reason.get("exception_message") if isinstance(reason, dict) else None
    return base.Failed(f"RH_{TASK_FAILED}", str(message or msg or "task failed"), detail=reason)


def _outputs_outcome(body: dict[str, Any], ended: bool) -> base.ResultOutcome:
    """Parse an ``/outputs`` answer (or a webhook's ``eventData``).

    ``ended`` (a TASK_END webhook) turns an unexpected non-zero code into a failure; in a
    query it is :class:`Unknown` (asked again later), never "pending" nor "gone".
    """
    code = as_int(body.get("code"))
    msg = str(body.get("msg") or "")
    if code is None:
        return base.Pending("INVALID_REPLY") if ended else base.Unknown("RH: no code in the reply")
    if code in SUCCESS_CODES:
        outputs = _normalized_outputs(body)
        return base.Succeeded(outputs, cost=_cost(outputs["data"]))
    if code in PENDING_CODES:
        return base.Pending(PENDING_CODES[code])
    if code == TASK_FAILED:
        return _failed(body, msg)
    if code in NOT_FOUND_CODES:
        return base.NotFound(msg or f"RH_{code}")
    if ended:
        return base.Failed(f"RH_{code}", msg, detail=body.get("data"))
    return base.Unknown(f"RH_{code} {msg}".rstrip())


class RunningHubAdapter(base.PlatformAdapter):
    name = "runninghub"
    kind = "callback"
    serves: ClassVar[tuple[str, ...]] = ("comfyui", "runninghub")

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        # RunningHub requires an exact Host header (platform-apis.md §1.1).
        self._headers = {
            "Content-Type": "application/json",
            "Host": urlsplit(self.base_url).netloc,
        }

    def _post(self, path: str, body: dict[str, Any]) -> base.HttpRequest:
        return base.HttpRequest("POST", self.base_url + path, dict(self._headers), body)

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> base.HttpRequest:
        body = {k: v for k, v in task.payload.items() if k not in OWN_FIELDS}
        if isinstance(body.get("workflow"), dict):  # the API wants the workflow as a string
            body["workflow"] = json.dumps(body["workflow"], ensure_ascii=False)
        body["apiKey"] = apikey
        if webhook_url:
            body["webhookUrl"] = webhook_url
        return self._post("/task/openapi/create", body)

    def parse_submit(self, status: int, body: Any) -> base.SubmitOutcome:
        if not isinstance(body, dict) or (code := as_int(body.get("code"))) is None:
            return unreadable_create(status)
        msg = str(body.get("msg") or "")
        if code in SUCCESS_CODES:
            data = body.get("data")
            task_id = data.get("taskId") if isinstance(data, dict) else None
            if task_id in (None, ""):
                return base.Rejected("RH_BAD_RESPONSE", "success without taskId", detail=body)
            return base.Accepted(str(task_id))
        if code in FULL_CODES:
            return base.Full(f"RH_{code} {msg}".rstrip())
        retryable = code in TRANSIENT_CODES or 500 <= code < 600
        return base.Rejected(f"RH_{code}", msg, retryable=retryable, detail=body.get("data"))

    def parse_result(self, body: Any) -> base.ResultOutcome:
        """Parse a ``TASK_END`` webhook; its ``eventData`` is a JSON string (or a dict)."""
        body = loads_if_json(body)
        if not isinstance(body, dict) or body.get("event", "TASK_END") != "TASK_END":
            return base.Pending("INVALID_CALLBACK")
        event_data = loads_if_json(body.get("eventData"))
        if not isinstance(event_data, dict):
            return base.Pending("INVALID_CALLBACK")
        outputs = event_data.get("data")
        if as_int(event_data.get("code")) in SUCCESS_CODES and not _is_output_list(outputs):
            raise ValueError("a success's eventData.data must be a list of objects")
        return _outputs_outcome(event_data, ended=True)

    def query_request(self, task: Task, apikey: str) -> base.HttpRequest:
        return self._post("/task/openapi/outputs", {"apiKey": apikey, "taskId": task.remote_id})

    def parse_query(self, status: int, body: Any) -> base.ResultOutcome:
        if status >= 500 or not isinstance(body, dict) or "raw" in body:
            return base.Unknown(f"RH: no valid reply (HTTP {status})")
        return _outputs_outcome(body, ended=False)

    def cancel_request(self, task: Task, apikey: str) -> base.HttpRequest | None:
        return self._post("/task/openapi/cancel", {"apiKey": apikey, "taskId": task.remote_id})

    def running_request(self, apikey: str) -> base.HttpRequest | None:
        """``accountStatus`` (its key spelt ``apikey``, platform-apis.md §1.7)."""
        return self._post("/uc/openapi/accountStatus", {"apikey": apikey})

    def parse_running(self, status: int, body: Any) -> int | None:
        """``currentTaskCounts``: the key's tasks running or queued (a string)."""
        state = self.parse_account(status, body)
        return None if state is None else state.tasks

    def parse_account(self, status: int, body: Any) -> base.AccountState | None:
        """``currentTaskCounts`` and ``remainCoins`` (strings in the vendor's example)."""
        if status >= 500 or not isinstance(body, dict):
            return None
        data = body.get("data")
        if as_int(body.get("code")) not in SUCCESS_CODES or not isinstance(data, dict):
            return None
        tasks = as_int(data.get("currentTaskCounts"))
        if tasks is None:
            return None
        try:
            coins = float(str(data["remainCoins"])) if data.get("remainCoins") is not None else None
        except ValueError:
            coins = None
        return base.AccountState(tasks, coins)


SPEC = register(
    PlatformSpec(
        RunningHubAdapter,
        url="https://www.runninghub.cn",
        workflow_field="workflowId",
        cost=("money", "coins", "seconds"),
        expiring_links=True,
        emulator="runninghub",
    )
)
