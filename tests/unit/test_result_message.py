"""A result message carries the platform's answer under ``result`` (the original system's
clients read ``{taskId, result}``) and under ``data``, the documented alias."""

from __future__ import annotations

import orjson

from aigcq.delivery.outbox import compose


def entry(body: dict[str, object], status: str = "success") -> dict[str, str]:
    return {"taskId": "t1", "status": status, "body": orjson.dumps(body).decode()}


def test_a_success_carries_result_and_its_alias_data() -> None:
    answer = {"code": 0, "data": [{"fileUrl": "u"}]}
    message = compose("1-0", entry({"result": answer}))
    assert message == {
        "type": "result", "id": "1-0", "taskId": "t1", "status": "success",
        "result": answer, "data": answer,
    }  # fmt: skip


def test_an_entry_written_before_result_existed_gains_it() -> None:
    message = compose("1-0", entry({"data": [1]}))
    assert message["result"] == message["data"] == [1]


def test_a_failure_carries_error_and_no_result() -> None:
    body = {"code": "TaskFailed", "msg": "m", "error": {"code": "x"}}
    message = compose("1-0", entry(body, "failed"))
    assert message["error"] == {"code": "x"} and "result" not in message and "data" not in message
