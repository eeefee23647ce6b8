"""Process-wide logging set-up, called once by each command line entry point."""

from __future__ import annotations

import logging
import os
from enum import StrEnum

from aigcq.observability.jsonlog import JsonFormatter, RedactSecrets, TextFormatter, TraceIds

LOG_FORMAT_ENV = "AIGCQ_LOG_FORMAT"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def configure_logging(level: str = "INFO") -> None:
    """Root logging at ``level``, as text or JSON lines (``AIGCQ_LOG_FORMAT``)."""
    handler = logging.StreamHandler()
    if os.environ.get(LOG_FORMAT_ENV, "").lower() == LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets())
    handler.addFilter(TraceIds())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # One line per outgoing request is noise at thousands of tasks a second.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))
