"""One JSON object per log line, for log shippers (``--log-format json``)."""

from __future__ import annotations

import json
import logging
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
