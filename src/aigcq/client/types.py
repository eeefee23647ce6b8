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

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def corrected_by(self, msg: dict[str, Any]) -> bool:
        """Whether the ``result`` message ``msg`` is a late success that replaces this
        failure (another outbox entry for the same task), rather than a copy of it."""
        late = msg.get("late") is True and msg.get("status") == "success"
        return late and not self.ok and msg.get("id", "") != self.id

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
