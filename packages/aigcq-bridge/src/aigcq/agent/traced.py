"""The bridge's part of a task's trace: a span for the ComfyUI run of each attempt.

A TASK_ASSIGN of a traced task carries the ``traceparent`` of its attempt (the hub's
``process`` span); with tracing on in the bridge (``OTEL_*``, see
:mod:`aigcq.observability.tracing`) the run is a ``process comfyui`` span under it, each
node ComfyUI executes an event on it (``executing``, with the node's id and name; the
nodes it took from its cache; the end), exported with the bridge's own ``OTEL_*``.
Tracing off, or a task sent without a ``traceparent``: nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from aigcq.observability import tracing

if TYPE_CHECKING:
    from aigcq.agent.following import RunningTask
    from aigcq.wire.bridge import TaskEndResult

#: ComfyUI's WebSocket events that become span events (``progress`` is too chatty)
TRACED_EVENTS = frozenset(
    {
        "execution_start",
        "execution_cached",
        "executing",
        "executed",
        "execution_success",
        "execution_error",
        "execution_interrupted",
    }
)


@contextlib.contextmanager
def run_span(task: RunningTask, traceparent: str | None) -> Iterator[Any]:
    """Around the run of ``task``: its span (None when not traced); ComfyUI's events on
    it while it runs (``task.on_event``)."""
    if not tracing.ON or not traceparent:
        yield None
        return
    attrs = tracing.messaging(
        "process",
        "process",
        "comfyui",
        task.task_id,
        {
            "aigcq.attempt": task.attempt or 0,
            "aigcq.prompt_id": task.prompt_id,
            "aigcq.instance": task.instance.instance_id,
        },
    )
    with tracing.span("process comfyui", traceparent, kind="consumer", attributes=attrs) as s:
        task.on_event = None if s is None else _events(task, s)
        try:
            yield s
        finally:
            task.on_event = None
            if s is not None:  # it may have moved to another instance
                with contextlib.suppress(Exception):
                    s.set_attribute("aigcq.instance", task.instance.instance_id)


def ended(span: Any, result: TaskEndResult) -> None:
    """The run's outcome on its span."""
    if span is None:
        return
    with contextlib.suppress(Exception):  # tracing never stands in a task's way
        span.set_attribute("aigcq.result.code", result.code)
        span.set_attribute("aigcq.result.files", len(result.data))
        if result.failure is not None:
            span.set_attribute("aigcq.failure.class", result.failure.failure_class)
            span.set_attribute("aigcq.failure.code", result.failure.code)
    if result.code != 0:
        tracing.failed(span, result.msg)


def _events(task: RunningTask, span: Any) -> Callable[[dict[str, Any]], None]:
    def on_event(event: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # tracing never stands in a task's way
            note(event)

    def note(event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind not in TRACED_EVENTS:
            return
        data = event.get("data") or {}
        attrs: dict[str, tracing.Attr] = {}
        node = data.get("node")
        if node is not None:
            attrs["comfyui.node.id"] = str(node)
            name = task.node_names.get(str(node))
            if name:
                attrs["comfyui.node.name"] = name
        elif kind == "executing":
            kind = "executing done"
        if kind == "execution_cached":
            attrs["comfyui.nodes"] = ",".join(map(str, data.get("nodes") or []))
        if kind == "execution_error" and data.get("exception_message"):
            attrs["comfyui.error"] = str(data["exception_message"])[:512]
        span.add_event(str(kind), attributes=attrs)

    return on_event
