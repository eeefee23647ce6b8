"""JSON log lines and the model-asynch ``/metrics`` endpoint."""

from __future__ import annotations

import json
import logging
import sys

import httpx

from aigcq.asynch.app import create_app
from aigcq.observability.jsonlog import JsonFormatter


def record(**extra: object) -> logging.LogRecord:
    args = ("t1", "x")
    rec = logging.LogRecord("aigcq.test", logging.WARNING, __file__, 1, "task %s: %s", args, None)
    rec.__dict__.update(extra)
    return rec


def test_json_lines_carry_context_from_extra() -> None:
    line = json.loads(JsonFormatter().format(record(taskId="t1", bridgeId="b1")))
    assert line["level"] == "WARNING" and line["logger"] == "aigcq.test"
    assert line["message"] == "task t1: x"
    assert (line["taskId"], line["bridgeId"]) == ("t1", "b1")
    assert line["time"].endswith("+00:00")


def test_json_lines_without_context_or_with_an_exception() -> None:
    assert "taskId" not in json.loads(JsonFormatter().format(record()))
    rec = record()
    try:
        raise ValueError("boom")
    except ValueError:
        rec.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter().format(rec))["exception"]


async def test_asynch_serves_metrics_before_its_service_is_attached() -> None:
    transport = httpx.ASGITransport(app=create_app(None))
    async with httpx.AsyncClient(transport=transport, base_url="http://asynch") as http:
        resp = await http.get("/metrics")
    assert resp.status_code == 200
    assert "# TYPE aigcq_asynch_gate_total counter" in resp.text


def test_credentials_in_logged_urls_are_masked() -> None:
    from aigcq.observability.jsonlog import RedactSecrets

    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, "", 0, '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5", "/ws?token=abc123&x=1&tasks=3"), None,
    )  # fmt: skip
    RedactSecrets().filter(record)
    assert record.getMessage() == '127.0.0.1:5 - "WebSocket /ws?token=***&x=1&tasks=3" [accepted]'
    hook = logging.LogRecord(
        "x", logging.INFO, "", 0, "POST /callback/all?t=1&a=1&s=f00d", (), None
    )
    RedactSecrets().filter(hook)
    assert hook.getMessage() == "POST /callback/all?t=1&a=1&s=***"
