"""The capacity feed's wire format (seed 000 §7), shared by its two ends: the
message-dispatcher serves it (:mod:`aigcq.dispatcher.capacity`), a queue backend
subscribes to it (:mod:`aigcq.mdclient.feed`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

FEED_PATH = "/ws/capacity"
#: aigcq's addition to the seed's messages: tasks handed back to the backend (§9.4.1)
DEGRADE = "TASK_DEGRADE"
DEGRADE_ACK = "TASK_DEGRADE_ACK"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message(kind: str, **data: Any) -> str:
    return orjson.dumps({"type": kind, "data": {"timestamp": now_iso(), **data}}).decode()
