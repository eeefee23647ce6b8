"""A result message carries the platform's answer under ``result`` (the original system's
clients read ``{taskId, result}``) and under ``data``, the documented alias."""

from __future__ import annotations

import orjson

from aigcq.client.types import Result
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


def test_the_attempt_an_entry_names_is_on_its_message() -> None:
    message = compose("1-0", entry({"result": 1}) | {"attempt": "2"})
    assert message["attempt"] == 2
    assert "attempt" not in compose("1-0", entry({"result": 1}))  # written before it existed


def test_the_sdk_takes_a_later_attempts_end_as_a_new_result_and_the_same_one_as_a_copy() -> None:
    first = Result.from_message({"taskId": "t1", "id": "1-0", "status": "cancelled", "attempt": 1})
    again = {"taskId": "t1", "id": "1-0", "status": "cancelled", "attempt": 1}
    retried = {"taskId": "t1", "id": "2-0", "status": "success", "attempt": 2}
    assert not first.replaced_by(again)  # the same entry, sent again
    assert not first.replaced_by(retried | {"attempt": 1})  # another entry, same attempt
    assert first.replaced_by(retried)
    assert not Result.from_message(retried).replaced_by(again | {"id": "3-0"})  # older
    late = {"taskId": "t1", "id": "2-0", "status": "success", "late": True}
    assert first.replaced_by(late)  # a late success, no attempt said
