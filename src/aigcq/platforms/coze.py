"""Coze adapter (polling platform): async workflow runs and their run histories.

The task payload carries ``workflow_id``, ``parameters`` and optionally ``bot_id``,
``app_id``, ``ext``; we add ``is_async: true``. The remote id is the ``execute_id``; the
poll URL also needs the workflow id, read back from the payload.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aigcq.domain import Task
from aigcq.platforms import base
from aigcq.platforms._parse import as_int, loads_if_json, unreadable_create
from aigcq.platforms.registry import PlatformSpec, register

#: rate limits: system request limit ("retry later"), RPM exceeded.
FULL_CODES = frozenset({4009, 4020})
#: transient: model error, internal error. Anything else (4000 params, 4100 token,
#: 4101 permission, 4200 workflow, 6003 async not allowed on the plan, ...) is permanent.
TRANSIENT_CODES = frozenset({4013, 5000})
NOT_FOUND = 4314


def decode_output(raw: Any) -> Any:
    """Undo Coze's double encoding of ``output``.

    ``output`` is a JSON string of an object (``{"Output": "<end node JSON>", ...}``); each
    of its string values that is itself a JSON object or array is decoded too, other
    strings (plain text) are kept as they are.
    """
    output = loads_if_json(raw)
    if isinstance(output, dict):
        return {key: loads_if_json(value) for key, value in output.items()}
    return output


def _cost(record: dict[str, Any]) -> base.Cost:
    """A run's ``usage.token_count`` (Coze reports tokens, not money: the configured price
    stands for it)."""
    usage = record.get("usage")
    tokens = as_int(usage.get("token_count")) if isinstance(usage, dict) else None
    return base.Cost(tokens=tokens)


def _failed(record: dict[str, Any]) -> base.Failed:
    code = record.get("error_code")
    message = record.get("error_message") or record.get("error_msg") or "workflow failed"
    detail = {"debug_url": record.get("debug_url", ""), "logid": record.get("logid", "")}
    return base.Failed(str(code) if code not in (None, "") else "Fail", str(message), detail=detail)


class CozeAdapter(base.PlatformAdapter):
    name = "coze"
    kind = "polling"
    serves = ("coze",)

    @staticmethod
    def _headers(apikey: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {apikey}", "Content-Type": "application/json"}

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> base.HttpRequest:
        body = {**task.payload, "is_async": True}
        return base.HttpRequest(
            "POST", f"{self.base_url}/v1/workflow/run", self._headers(apikey), body
        )

    def parse_submit(self, status: int, body: Any) -> base.SubmitOutcome:
        # A missing ``code`` means 0 (one documented async reply omits it).
        if not isinstance(body, dict) or (code := as_int(body.get("code", 0))) is None:
            return unreadable_create(status)
        if code == 0 and status >= 400:
            return unreadable_create(status)
        msg = str(body.get("msg") or "")
        if code == 0:
            execute_id = body.get("execute_id")
            if execute_id in (None, ""):
                return base.Rejected("COZE_BAD_RESPONSE", "success without execute_id", detail=body)
            return base.Accepted(str(execute_id))
        if code in FULL_CODES:
            return base.Full(f"COZE_{code} {msg}".rstrip())
        return base.Rejected(f"COZE_{code}", msg, retryable=code in TRANSIENT_CODES, detail=body)

    def query_request(self, task: Task, apikey: str) -> base.HttpRequest:
        workflow_id = quote(str(task.payload.get("workflow_id") or task.workflow_id), safe="")
        execute_id = quote(task.remote_id, safe="")
        url = f"{self.base_url}/v1/workflows/{workflow_id}/run_histories/{execute_id}"
        return base.HttpRequest("GET", url, self._headers(apikey))

    def parse_query(self, status: int, body: Any) -> base.ResultOutcome:
        if status >= 500 or not isinstance(body, dict) or "raw" in body:
            return base.Unknown(f"COZE: no valid reply (HTTP {status})")
        if (code := as_int(body.get("code", 0))) is None:
            return base.Unknown(f"COZE: unreadable code (HTTP {status})")
        if code == NOT_FOUND:
            return base.NotFound(str(body.get("msg") or "execution record not found"))
        if code != 0:
            return base.Unknown(f"COZE_{code} {body.get('msg') or ''}".rstrip())  # ask again
        records = body.get("data")
        record = records[0] if isinstance(records, list) and records else None
        if not isinstance(record, dict):
            return base.NotFound("empty run history")
        status_text = str(record.get("execute_status", ""))
        match status_text.lower():
            case "success":
                return base.Succeeded(decode_output(record.get("output")), cost=_cost(record))
            case "fail":
                return _failed(record)
            case _:
                return base.Pending(status_text or "Running")


SPEC = register(
    PlatformSpec(
        CozeAdapter,
        url="https://api.coze.cn",
        workflow_field="workflow_id",
        cost=("tokens",),
        emulator="coze",
    )
)
