"""JSON log lines and the model-asynch ``/metrics`` endpoint."""

from __future__ import annotations

import json
import logging
import sys

import httpx

from aigcq.asynch.app import create_app
from aigcq.jsonlog import JsonFormatter


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
