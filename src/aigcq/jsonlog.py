"""Log formatting: one JSON object per line (``--log-format json``), secrets masked."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

#: ``extra`` keys copied into the line when a log call passes them
CONTEXT_FIELDS = ("taskId", "bridgeId")


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"}``, plus ``taskId`` / ``bridgeId`` and the
    exception when present."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line |= {k: getattr(record, k) for k in CONTEXT_FIELDS if hasattr(record, k)}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


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
