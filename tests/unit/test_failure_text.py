"""A task's failure as every view shows it: class, code and message (issue 29 item 1)."""

from __future__ import annotations

from aigcq.cli.status import failure_text
from aigcq.domain import Task, TaskState


def failed(error: dict[str, object] | None) -> Task:
    return Task("t", "comfyui", "proj", "b1", {}, state=TaskState.FAILED, error=error)


def test_a_bridges_failure_keeps_its_class() -> None:
    error = {"code": "NodeError", "message": "boom", "detail": {"class": "infrastructure"}}
    failure = failed(error).failure
    assert failure is not None
    assert failure == {"class": "infrastructure", "code": "NodeError", "message": "boom"}
    assert failure_text(failure) == "NodeError (infrastructure): boom"


def test_a_failure_without_class_reads_code_and_message() -> None:
    error = {"code": "TaskTimeout", "message": "no result in 600 s", "detail": None}
    failure = failed(error).failure
    assert failure is not None
    assert failure == {"class": None, "code": "TaskTimeout", "message": "no result in 600 s"}
    assert failure_text(failure) == "TaskTimeout: no result in 600 s"


def test_no_error_no_failure() -> None:
    assert failed(None).failure is None
