"""What the client SDK hands to its caller: results, progress events and errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self


class AigcqError(Exception):
    """An ``error`` reply from aigcq (or a connection it refused)."""

    def __init__(self, code: str, msg: str = "", detail: Any = None, task_id: str | None = None):
        super().__init__(f"{code}: {msg} {detail or ''}".rstrip())
        self.code = code
        self.msg = msg
        self.detail = detail
        self.task_id = task_id

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Self:
        code, msg = str(reply.get("code", "")), str(reply.get("msg", ""))
        return cls(code, msg, reply.get("detail"), reply.get("taskId"))


class SubmitError(AigcqError):
    """A ``generate`` was refused (``JSONError``, ``PlatformError``, ``TaskConflict``…)."""


@dataclass(frozen=True, slots=True)
class Result:
    """A task's final result: ``status`` is ``success``, ``failed`` or ``cancelled``."""

    task_id: str
    status: str
    data: Any = None
    code: str | None = None
    msg: str | None = None
    error: dict[str, Any] | None = None
    id: str = ""  # the outbox entry, acknowledged once the result is handed over
    #: a paid run's success that came after this task was reported failed
    #: (``UncertainSubmit``): it replaces that failure
    late: bool = False
    #: the attempt of the task this result ends (0: not said); an operator's retry ends a
    #: later one, whose result replaces this one
    attempt: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def replaced_by(self, msg: dict[str, Any]) -> bool:
        """Whether the ``result`` message ``msg`` (another outbox entry for the same task)
        replaces this result rather than copies it: the end of a later attempt (an
        operator's retry), or a late success after this failure."""
        if msg.get("id", "") == self.id:
            return False
        attempt = msg.get("attempt")
        later = isinstance(attempt, int) and attempt > self.attempt
        late = msg.get("late") is True and msg.get("status") == "success" and not self.ok
        return later or late

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Result:
        return cls(
            task_id=msg["taskId"],
            status=msg.get("status", ""),
            data=msg.get("result", msg.get("data")),  # "data": aigcq's earlier name
            code=msg.get("code"),
            msg=msg.get("msg"),
            error=msg.get("error"),
            id=msg.get("id", ""),
            late=msg.get("late") is True,
            attempt=attempt if isinstance(attempt := msg.get("attempt"), int) else 0,
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """Live, best-effort news of a task: steps (``value``/``max``, ``node``) or a ``state``."""

    task_id: str
    value: int | None = None
    max: int | None = None
    node: str | None = None
    state: str | None = None
    target: str | None = None
    #: the node's name (its title, else its class), when the bridge knows it
    node_name: str | None = None

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Progress:
        return cls(
            task_id=msg["taskId"],
            value=msg.get("value"),
            max=msg.get("max"),
            node=msg.get("node"),
            state=msg.get("state"),
            target=msg.get("target"),
            node_name=msg.get("nodeName"),
        )


Event = Progress | Result
