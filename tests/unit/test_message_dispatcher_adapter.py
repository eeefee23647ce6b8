"""The message-dispatcher adapter: RunningHub's body but for ``apiKey``, §3.3.3 mapping."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from aigcq.domain import Task
from aigcq.platforms.base import Accepted, Full, Rejected, Succeeded
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.message_dispatcher import TOKEN_REFUSED, MessageDispatcherAdapter
from aigcq.platforms.registry import registered
from aigcq.platforms.runninghub import RunningHubAdapter

PAYLOAD: dict[str, Any] = {
    "workflowId": "1904136902449209346",
    "nodeInfoList": [{"nodeId": "6", "fieldName": "text", "fieldValue": "a cat"}],
    "workflow": {"9": {"class_type": "SaveImage", "inputs": {}}},
    "instanceType": "plus",
    "addMetadata": True,
    "apiKey": "client-supplied, replaced",
    "webhookUrl": "http://client/ignored",
}
HOOK = "http://aigcq:8089/callback/all?t=t1&a=1&s=sig"


@pytest.fixture
def md() -> MessageDispatcherAdapter:
    return MessageDispatcherAdapter("http://md:4000/")


def test_body_equals_runninghubs_except_api_key(md: MessageDispatcherAdapter) -> None:
    task = Task("t1", "comfyui", "img", "b1", dict(PAYLOAD))
    rh_req = RunningHubAdapter("https://www.runninghub.cn").submit_request(task, "rh-key", HOOK)
    md_req = md.submit_request(task, "eyJhbGciOiJIUzI1NiJ9.jwt", HOOK)
    assert md_req.json.pop("apiKey") == "eyJhbGciOiJIUzI1NiJ9.jwt"
    assert rh_req.json.pop("apiKey") == "rh-key"
    assert md_req.json == rh_req.json
    assert md_req.url == "http://md:4000/api/task" and md_req.method == rh_req.method
    assert json.loads(md_req.json["workflow"]) == PAYLOAD["workflow"]
    assert md_req.json["webhookUrl"] == HOOK


def test_success_maps_request_id_to_task_id(md: MessageDispatcherAdapter) -> None:
    body = {"success": True, "data": {"requestId": "r-1", "taskId": "t-9"}}
    assert md.parse_submit(200, body) == Accepted("r-1")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (503, {"success": False, "error": {"code": "NoCapacity", "message": "full"}}, Full),
        (401, {"success": False, "error": {"code": "Unauthorized", "message": "x"}}, Rejected),
        (400, {"success": False, "error": {"code": "InvalidBody", "message": "x"}}, Rejected),
        (502, "<html>bad gateway</html>", Rejected),
        (200, {"success": True, "data": {}}, Rejected),
    ],
)
def test_errors(md: MessageDispatcherAdapter, status: int, body: Any, expected: type) -> None:
    assert isinstance(md.parse_submit(status, body), expected)


def test_401_and_5xx_are_retryable_400_is_not(md: MessageDispatcherAdapter) -> None:
    err = {"success": False, "error": {"code": "E", "message": ""}}
    refused = Rejected(TOKEN_REFUSED, "token refused", retryable=True, detail=err["error"])
    assert md.parse_submit(401, err) == refused
    assert md.parse_submit(401, "Unauthorized") == replace(refused, detail=None)
    server, client = md.parse_submit(500, err), md.parse_submit(400, err)
    assert isinstance(server, Rejected) and server.retryable
    assert isinstance(client, Rejected) and not client.retryable


def test_results_and_queries_are_runninghubs(md: MessageDispatcherAdapter) -> None:
    event = {"code": 0, "msg": "success", "data": [{"fileUrl": "u", "taskCostTime": "3"}]}
    webhook = {"event": "TASK_END", "taskId": "r-1", "eventData": json.dumps(event)}
    assert isinstance(md.parse_result(webhook), Succeeded)
    task = Task("t1", "comfyui", "img", "b1", {}, remote_id="r-1")
    assert md.query_request(task, "jwt").url == "http://md:4000/task/openapi/outputs"


def test_never_the_overflow_target_of_comfyui() -> None:
    adapters = {name: cls("http://x") for name, cls in registered().items()}
    assert registered()["message_dispatcher"] is MessageDispatcherAdapter
    adapter = PlatformClient(adapters, timeout_s=1).adapter_for("comfyui")
    assert adapter is not None and adapter.name == "runninghub"


def test_an_attached_token_replaces_the_configured_key(md: MessageDispatcherAdapter) -> None:
    task = Task("t1", "comfyui", "img", "b1", {}, remote_id="r-1")
    assert md.query_request(task, "rh-key").json["apiKey"] == "rh-key"
    md.token = lambda: "jwt-now"
    assert md.query_request(task, "rh-key").json["apiKey"] == "jwt-now"
    cancel = md.cancel_request(task, "rh-key")
    assert cancel is not None and cancel.json["apiKey"] == "jwt-now"
