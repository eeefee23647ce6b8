"""Coze adapter: request building, code classes, double-encoded output, poll interval."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aigcq.domain import Task
from aigcq.platforms.base import (
    Accepted,
    Failed,
    Full,
    NotFound,
    Pending,
    Rejected,
    Succeeded,
    Uncertain,
    Unknown,
)
from aigcq.platforms.coze import (
    CozeAdapter,
    decode_output,
)
from aigcq.platforms.registry import registered

BASE = "https://api.coze.cn"
PAYLOAD = {"workflow_id": "7428", "parameters": {"prompt": "a cat"}, "bot_id": "b9"}


def make_task(payload: dict[str, Any] | None = None, **fields: Any) -> Task:
    return Task("t1", "coze", "chat", "b1", dict(payload or PAYLOAD), **fields)


def record(status: str, **fields: Any) -> dict[str, Any]:
    return {"code": 0, "msg": "", "data": [{"execute_status": status, **fields}]}


@pytest.fixture
def coze() -> CozeAdapter:
    return CozeAdapter(BASE)


def test_registered_as_polling_platform() -> None:
    cls = registered()["coze"]
    assert cls is CozeAdapter
    assert (cls.kind, cls.serves) == ("polling", ("coze",))


def test_submit_request_is_async_with_bearer_auth(coze: CozeAdapter) -> None:
    request = coze.submit_request(make_task({**PAYLOAD, "is_async": False}), "pat_x", "")
    assert (request.method, request.url) == ("POST", f"{BASE}/v1/workflow/run")
    assert request.headers["Authorization"] == "Bearer pat_x"
    assert request.json == {**PAYLOAD, "is_async": True}


def test_query_request_uses_the_payload_workflow_and_execute_id(coze: CozeAdapter) -> None:
    request = coze.query_request(make_task(remote_id="74248231312884"), "pat_x")
    assert request.method == "GET"
    assert request.url == f"{BASE}/v1/workflows/7428/run_histories/74248231312884"
    assert request.headers["Authorization"] == "Bearer pat_x"
    assert coze.cancel_request(make_task(), "pat_x") is None


def test_query_request_falls_back_to_the_task_workflow_id(coze: CozeAdapter) -> None:
    task = make_task({"parameters": {}}, remote_id="1", workflow_id="w/1")
    assert coze.query_request(task, "k").url.endswith("/v1/workflows/w%2F1/run_histories/1")


@pytest.mark.parametrize(
    "body",
    [
        {"code": 0, "msg": "Success", "execute_id": "742", "debug_url": "https://x"},
        {"msg": "", "execute_id": 742},  # one documented reply omits code
        {"code": "0", "execute_id": "742"},
    ],
)
def test_parse_submit_accepted(coze: CozeAdapter, body: dict[str, Any]) -> None:
    assert coze.parse_submit(200, body) == Accepted("742")


@pytest.mark.parametrize("code", [4009, 4020, "4020"])
def test_parse_submit_rate_limits_are_full(coze: CozeAdapter, code: Any) -> None:
    assert isinstance(coze.parse_submit(200, {"code": code, "msg": "slow down"}), Full)


@pytest.mark.parametrize(("status", "code"), [(200, 4013), (200, 5000), (500, 5000)])
def test_parse_submit_transient_codes_are_retryable(
    coze: CozeAdapter, status: int, code: int
) -> None:
    outcome = coze.parse_submit(status, {"code": code, "msg": "busy"})
    assert isinstance(outcome, Rejected)
    assert (outcome.code, outcome.retryable) == (f"COZE_{code}", True)


@pytest.mark.parametrize("code", [4000, 4100, 4101, 4200, 6003, 4011, "4100"])
def test_parse_submit_other_codes_are_permanent(coze: CozeAdapter, code: Any) -> None:
    outcome = coze.parse_submit(200, {"code": code, "msg": "no"})
    assert isinstance(outcome, Rejected)
    assert (outcome.code, outcome.message, outcome.retryable) == (f"COZE_{code}", "no", False)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (502, "<html/>", Uncertain),  # a gateway's page: the create may have gone through
        (503, {}, Uncertain),
        (429, None, Full),
        (200, {"code": 0, "msg": "ok"}, Rejected),  # success without execute_id
    ],
)
def test_parse_submit_odd_answers(
    coze: CozeAdapter, status: int, body: Any, expected: type
) -> None:
    assert isinstance(coze.parse_submit(status, body), expected)


def test_parse_submit_5xx_without_code_is_uncertain_never_sent_again(coze: CozeAdapter) -> None:
    """Only Coze's own code refuses for sure: a bare 503 may have run the workflow."""
    assert coze.parse_submit(503, {}) == Uncertain("no readable reply (HTTP 503)")


def test_parse_query_running_is_pending(coze: CozeAdapter) -> None:
    assert coze.parse_query(200, record("Running", output="")) == Pending("Running")


def test_parse_query_success_decodes_the_double_encoded_output(coze: CozeAdapter) -> None:
    end_node = {"content_type": 1, "data": "a cat", "original_result": None}
    output = json.dumps({"Output": json.dumps(end_node), "note": "plain text"})
    outcome = coze.parse_query(200, record("Success", output=output))
    assert outcome == Succeeded({"Output": end_node, "note": "plain text"})


@pytest.mark.parametrize("error_code", [720701013, "720701013"])
def test_parse_query_fail(coze: CozeAdapter, error_code: Any) -> None:
    body = record("Fail", error_code=error_code, error_message="node failed", debug_url="u")
    assert coze.parse_query(200, body) == Failed(
        "720701013", "node failed", {"debug_url": "u", "logid": ""}
    )


def test_parse_query_fail_tolerates_error_msg_and_no_code(coze: CozeAdapter) -> None:
    outcome = coze.parse_query(200, record("Fail", error_code="", error_msg="bad"))
    assert isinstance(outcome, Failed)
    assert (outcome.code, outcome.message) == ("Fail", "bad")


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, {"code": 4314, "msg": "execution record not found"}, NotFound),
        (200, {"code": "4314", "msg": ""}, NotFound),
        (200, {"code": 0, "msg": "", "data": []}, NotFound),
        (200, {"code": 5000, "msg": "internal"}, Unknown),
        (502, "<html/>", Unknown),
        (200, {"raw": "<html/>"}, Unknown),
        (503, {"code": 0, "data": []}, Unknown),
        (200, record("Queued?"), Pending),
    ],
)
def test_parse_query_other_answers(
    coze: CozeAdapter, status: int, body: Any, expected: type
) -> None:
    assert isinstance(coze.parse_query(status, body), expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"Output": "{\\"a\\": [1, 2]}"}', {"Output": {"a": [1, 2]}}),
        ('{"Output": "hello"}', {"Output": "hello"}),
        ('{"Output": "123"}', {"Output": "123"}),  # only objects/arrays are decoded
        ('{"Output": "{broken"}', {"Output": "{broken"}),
        ("not json", "not json"),
        ("", ""),
        (None, None),
        ({"Output": "[1]"}, {"Output": [1]}),
    ],
)
def test_decode_output(raw: Any, expected: Any) -> None:
    assert decode_output(raw) == expected
