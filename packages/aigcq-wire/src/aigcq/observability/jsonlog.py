"""Log formatting: one JSON object per line (``--log-format json``), secrets masked."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from aigcq.observability import tracing

#: ``extra`` keys copied into the line when a log call passes them
CONTEXT_FIELDS = ("taskId", "bridgeId")


def say_task(log: logging.Logger, level: int, task_id: str, message: str, *args: object) -> None:
    """One line of ``log`` about a task: ``task <id>: <message>``, the id in the record too
    (nothing is formatted when ``level`` is off)."""
    if log.isEnabledFor(level):
        log.log(level, "task %s: " + message, task_id, *args, extra=ctx(task=task_id))


def ctx(task: object = None, bridge: object = None) -> dict[str, str]:
    """The ``extra`` for a log line about a task and/or a bridge:
    ``log.info("...", task_id, extra=ctx(task=task_id))``; ``None`` keys are left out."""
    extra: dict[str, str] = {}
    if task is not None:
        extra["taskId"] = str(task)
    if bridge is not None:
        extra["bridgeId"] = str(bridge)
    return extra


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"}``, plus ``taskId`` / ``bridgeId``, the
    ``trace_id`` and ``span_id`` of the span current when the line was logged (tracing on,
    :mod:`aigcq.observability.tracing`), and the exception when present."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line |= {k: getattr(record, k) for k in CONTEXT_FIELDS if hasattr(record, k)}
        ids = getattr(record, "otel_ids", None)
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The plain-text format, with `` task=… bridge=…`` appended when the call passed them."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        for key, label in zip(CONTEXT_FIELDS, ("task", "bridge"), strict=True):
            value = getattr(record, key, None)
            if value is not None:
                line += f" {label}={value}"
        return line


class TraceIds(logging.Filter):
    """Notes on each record the ids of the span current where it was logged (tracing on):
    a handler's filter runs in the logging call's own context, a formatter may not."""

    def filter(self, record: logging.LogRecord) -> bool:
        if tracing.ON:
            record.otel_ids = tracing.current_ids()
        return True


class RedactSecrets(logging.Filter):
    """Masks credentials in query strings: uvicorn logs WebSocket URLs with ``token=``,
    and webhook URLs carry their signature in ``s=``."""

    PATTERN = re.compile(r"([?&](?:token|apiKey|apikey|s)=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.PATTERN.sub(r"\1***", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
