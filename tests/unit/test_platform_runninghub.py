"""RunningHub adapter: request building and tolerant parsing of every code class."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aigcq.domain import Task
from aigcq.platforms.base import (
    Accepted,
    Cost,
    Failed,
    Full,
    NotFound,
    Pending,
    Rejected,
    Succeeded,
    Uncertain,
    Unknown,
)
from aigcq.platforms.registry import registered
from aigcq.platforms.runninghub import RunningHubAdapter

BASE = "https://www.runninghub.cn/"
OUTPUT = {"fileUrl": "https://x/y.png", "fileType": "png", "taskCostTime": "12", "nodeId": "9"}
OUTPUTS = {"code": 0, "msg": "success", "data": [OUTPUT]}
FAILED_OUTPUTS = {
    "code": 805,
    "msg": "APIKEY_TASK_STATUS_ERROR",
    "data": {"failedReason": {"exception_message": "boom", "node_id": "276"}},
}


def make_task(**payload: Any) -> Task:
    return Task("t1", "comfyui", "img", "b1", payload, remote_id="1904163390028185602")


@pytest.fixture
def rh() -> RunningHubAdapter:
    return RunningHubAdapter(BASE)


def test_registered_as_callback_platform() -> None:
    cls = registered()["runninghub"]
    assert cls is RunningHubAdapter
    assert cls.kind == "callback"
    assert cls.serves == ("comfyui", "runninghub")


def test_submit_request_adds_key_and_our_webhook(rh: RunningHubAdapter) -> None:
    nodes = [{"nodeId": "6", "fieldName": "text", "fieldValue": "a cat"}]
    task = make_task(
        workflowId="1904136902449209346",
        nodeInfoList=nodes,
        instanceType="plus",
        webhookUrl="https://client.example/hook",
        apiKey="client-key",
    )
    request = rh.submit_request(task, "k" * 32, "https://us.example/cb?sig=a%2Bb&t=1")
    assert request.method == "POST"
    assert request.url == "https://www.runninghub.cn/task/openapi/create"
    assert request.headers == {"Content-Type": "application/json", "Host": "www.runninghub.cn"}
    assert request.json == {
        "workflowId": "1904136902449209346",
        "nodeInfoList": nodes,
        "instanceType": "plus",
        "apiKey": "k" * 32,
        "webhookUrl": "https://us.example/cb?sig=a%2Bb&t=1",
    }
    assert task.payload["apiKey"] == "client-key"  # the task itself is left alone


def test_submit_request_encodes_a_workflow_object_as_a_string(rh: RunningHubAdapter) -> None:
    workflow = {"9": {"class_type": "SaveImage", "inputs": {}}}
    request = rh.submit_request(make_task(workflow=workflow), "key", "")
    assert json.loads(request.json["workflow"]) == workflow
    assert "webhookUrl" not in request.json


def test_host_header_keeps_the_port() -> None:
    request = RunningHubAdapter("http://127.0.0.1:9101").query_request(make_task(), "key")
    assert request.headers["Host"] == "127.0.0.1:9101"


@pytest.mark.parametrize("code", [0, "0", 200])
def test_parse_submit_accepted(rh: RunningHubAdapter, code: Any) -> None:
    body = {"code": code, "msg": "success", "data": {"taskId": 1910246754753896450}}
    assert rh.parse_submit(200, body) == Accepted("1910246754753896450")


def test_parse_submit_success_without_task_id_is_rejected(rh: RunningHubAdapter) -> None:
    outcome = rh.parse_submit(200, {"code": 0, "msg": "success", "data": None})
    assert isinstance(outcome, Rejected)
    assert not outcome.retryable


@pytest.mark.parametrize("code", [421, 415, 1520, 1003, 1011, "421"])
def test_parse_submit_capacity_codes_are_full(rh: RunningHubAdapter, code: Any) -> None:
    outcome = rh.parse_submit(200, {"code": code, "msg": "TASK_QUEUE_MAXED"})
    assert isinstance(outcome, Full)
    assert str(code) in outcome.reason


@pytest.mark.parametrize("code", [500, 1005, 1010, 1012, 503])
def test_parse_submit_transient_codes_are_retryable(rh: RunningHubAdapter, code: int) -> None:
    outcome = rh.parse_submit(200, {"code": code, "msg": "UNKNOWN_ERROR"})
    assert outcome == Rejected(f"RH_{code}", "UNKNOWN_ERROR", retryable=True)


@pytest.mark.parametrize("code", [301, 380, 433, 801, 802, 803, 812, 416, 814, "802"])
def test_parse_submit_other_codes_are_permanent(rh: RunningHubAdapter, code: Any) -> None:
    body = {"code": code, "msg": "APIKEY_UNAUTHORIZED", "data": {"x": 1}}
    outcome = rh.parse_submit(200, body)
    assert outcome == Rejected(f"RH_{code}", "APIKEY_UNAUTHORIZED", False, {"x": 1})


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (502, "<html>bad gateway</html>"),  # a gateway's page on a create that went through
        (504, "<html>gateway time-out</html>"),
        (500, None),
        (200, {"msg": "no code"}),
        (404, {}),
        (408, None),
    ],
)
def test_parse_submit_without_runninghubs_code_is_uncertain(
    rh: RunningHubAdapter, status: int, body: Any
) -> None:
    """Only RunningHub's own JSON code is a definite refusal: anything else on a create
    may have been billed, so it is never sent again blindly."""
    assert rh.parse_submit(status, body) == Uncertain(f"no readable reply (HTTP {status})")


def test_parse_submit_http_429_is_full(rh: RunningHubAdapter) -> None:
    assert isinstance(rh.parse_submit(429, None), Full)


def test_parse_result_decodes_the_json_string_event_data(rh: RunningHubAdapter) -> None:
    body = {"event": "TASK_END", "taskId": "1", "eventData": json.dumps(OUTPUTS)}
    outcome = rh.parse_result(body)
    assert outcome == Succeeded(
        {
            "code": 0,
            "msg": "success",
            "data": [{**OUTPUT, "taskCostTime": 12}],
        },
        cost=Cost(seconds=12),
    )


def test_parse_result_tolerates_dict_event_data_and_int_cost(rh: RunningHubAdapter) -> None:
    outputs = {**OUTPUTS, "data": [{**OUTPUT, "taskCostTime": 12}]}
    as_string = rh.parse_result({"event": "TASK_END", "eventData": json.dumps(OUTPUTS)})
    as_dict = rh.parse_result({"event": "TASK_END", "eventData": outputs})
    assert as_string == as_dict


def test_parse_result_accepts_the_raw_body_text(rh: RunningHubAdapter) -> None:
    raw = json.dumps({"event": "TASK_END", "taskId": "1", "eventData": json.dumps(OUTPUTS)})
    assert isinstance(rh.parse_result(raw), Succeeded)
    assert isinstance(rh.parse_result(raw.encode()), Succeeded)


def test_parse_result_failure_carries_the_failed_reason(rh: RunningHubAdapter) -> None:
    outcome = rh.parse_result({"event": "TASK_END", "eventData": json.dumps(FAILED_OUTPUTS)})
    assert outcome == Failed(
        "RH_805", "boom", detail={"exception_message": "boom", "node_id": "276"}
    )


def test_parse_result_unexpected_code_fails_the_task(rh: RunningHubAdapter) -> None:
    event_data = json.dumps({"code": 500, "msg": "UNKNOWN_ERROR", "data": None})
    outcome = rh.parse_result({"event": "TASK_END", "eventData": event_data})
    assert outcome == Failed("RH_500", "UNKNOWN_ERROR")


@pytest.mark.parametrize(
    "body",
    [None, "not json", {"event": "OTHER", "eventData": "{}"}, {"event": "TASK_END"}, {"x": 1}],
)
def test_parse_result_garbage_changes_nothing(rh: RunningHubAdapter, body: Any) -> None:
    assert isinstance(rh.parse_result(body), Pending)


def test_query_and_cancel_requests(rh: RunningHubAdapter) -> None:
    task = make_task()
    query = rh.query_request(task, "key")
    cancel = rh.cancel_request(task, "key")
    assert cancel is not None
    assert query.url == "https://www.runninghub.cn/task/openapi/outputs"
    assert cancel.url == "https://www.runninghub.cn/task/openapi/cancel"
    for request in (query, cancel):
        assert request.method == "POST"
        assert request.json == {"apiKey": "key", "taskId": "1904163390028185602"}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"code": 804, "msg": "APIKEY_TASK_IS_RUNNING", "data": None}, Pending("RUNNING")),
        ({"code": "813", "msg": "APIKEY_TASK_IS_QUEUED", "data": None}, Pending("QUEUED")),
        ({"code": 807, "msg": "APIKEY_TASK_NOT_FOUND"}, NotFound("APIKEY_TASK_NOT_FOUND")),
        ({"code": 423, "msg": "TASK_NOT_FOUNED"}, NotFound("TASK_NOT_FOUNED")),
        ({"code": 500, "msg": "UNKNOWN_ERROR"}, Unknown("RH_500 UNKNOWN_ERROR")),
        (FAILED_OUTPUTS, Failed("RH_805", "boom", {"exception_message": "boom", "node_id": "276"})),
    ],
)
def test_parse_query_codes(rh: RunningHubAdapter, body: Any, expected: Any) -> None:
    assert rh.parse_query(200, body) == expected


def test_parse_query_success_has_the_webhook_shape(rh: RunningHubAdapter) -> None:
    webhook = rh.parse_result({"event": "TASK_END", "eventData": json.dumps(OUTPUTS)})
    assert rh.parse_query(200, OUTPUTS) == webhook


def test_parse_query_failed_reason_as_string_and_without_message(rh: RunningHubAdapter) -> None:
    body = {"code": 805, "msg": "APIKEY_TASK_STATUS_ERROR", "data": {"failedReason": "{}"}}
    assert rh.parse_query(200, body) == Failed("RH_805", "APIKEY_TASK_STATUS_ERROR", {})


@pytest.mark.parametrize(
    ("status", "body"),
    [(502, "<html/>"), (200, None), (500, {}), (200, {"raw": "<html/>"}), (200, {"msg": "?"})],
)
def test_parse_query_without_an_answer_is_unknown_never_pending(
    rh: RunningHubAdapter, status: int, body: Any
) -> None:
    """Issue 15 item 3: a failed status query is "unknown" (ask again), never "pending"."""
    assert isinstance(rh.parse_query(status, body), Unknown)


def test_the_accounts_running_tasks_are_read_from_account_status() -> None:
    """``accountStatus`` (lower-case ``apikey``): ``currentTaskCounts`` is a string; any
    other answer is no answer, never "nothing runs"."""
    rh = RunningHubAdapter(BASE)
    req = rh.running_request("k")
    assert req is not None and req.url.endswith("/uc/openapi/accountStatus")
    assert req.json == {"apikey": "k"}
    ok = {"code": 0, "msg": "success", "data": {"currentTaskCounts": "0", "remainCoins": "9"}}
    assert rh.parse_running(200, ok) == 0
    assert rh.parse_running(200, {**ok, "data": {"currentTaskCounts": "3"}}) == 3
    assert rh.parse_running(502, {"raw": "<html>"}) is None
    assert rh.parse_running(200, {"code": 802, "msg": "APIKEY_UNAUTHORIZED", "data": None}) is None
    assert rh.parse_running(200, {"code": 0, "data": {}}) is None
