"""The durable per-client outbox (seed 001 §9): a Redis Stream per backendId.

``finish.lua`` appends a task's final message to its client's stream in the same atomic
step that ends the task, so a result can never be lost between "done" and "queued for
delivery". Messages are sent in order; without client acks they are deleted once
written to the socket, with acks (``{"type":"ack","id":...}``) only when acknowledged.
Entries older than the retention are trimmed by ``XADD MINID`` and by a periodic sweep
(:mod:`aigcq.delivery.retention`), which also drops the streams of clients that never
come back; a drain reads only from the retention's first id on, so a client that returns
before the sweep does not get what is already past it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from aigcq.plumbing.redis_mux import RedisMux
from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys, outbox_minid

Send = Callable[[dict[str, Any]], Awaitable[None]]

PAGE = 200


def compose(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """The client's ``result`` message. A success carries the platform's answer under
    ``result``, as the original system's clients read it, and under ``data`` (the
    documented alias); entries written before ``result`` existed hold only ``data``. It
    names the attempt of the task it ends (``attempt``), where the entry says it: an
    operator's retry ends a later one."""
    body = orjson.loads(fields.get("body") or "{}")
    if "result" in body or "data" in body:
        answer = body.get("result", body.get("data"))
        body = {**body, "result": answer, "data": answer}
    message = {
        "type": "result",
        "id": entry_id,
        "taskId": fields.get("taskId", ""),
        "status": fields.get("status", ""),
        **body,
    }
    if attempt := fields.get("attempt"):
        message["attempt"] = int(attempt)
    return message


@dataclass
class DrainCursor:
    """Where one connection's delivery stands: the last entry sent on it, and the entries
    to delete at its next drain: sent but not yet deleted (auto-ack), or acknowledged by
    the client while Redis did not answer (else each later connection would send them
    again). It moves with every message sent, so a drain that fails half-way resumes after
    the last message sent, never resending a page."""

    after: str = "-"
    unacked: list[str] = field(default_factory=list)


class Outbox:
    def __init__(self, mux: RedisMux, keys: Keys, *, retention_s: float | None = None) -> None:
        """``mux``: the hot-path connection (concurrent drains and acks share writes);
        ``retention_s``: how old a message may be when sent (None: any age)."""
        self.mux = mux
        self.keys = keys
        self.retention_s = retention_s

    async def drain(
        self, backend_id: str, send: Send, cursor: DrainCursor, *, auto_ack: bool
    ) -> None:
        """Send every message after ``cursor``, moving it along as each one is sent."""
        key = self.keys.outbox(backend_id)
        await self._forget(key, cursor)  # what a failed round sent but could not delete
        try:
            while True:
                start = self._start(cursor)
                entries = await self.mux.command("XRANGE", key, start, "+", "COUNT", PAGE)
                for raw_id, raw_fields in entries or []:  # [id, [field, value, ...]]
                    entry_id = text(raw_id)
                    flat = [text(x) for x in raw_fields or []]
                    await send(compose(entry_id, dict(zip(flat[0::2], flat[1::2], strict=True))))
                    cursor.after = entry_id
                    if auto_ack:
                        cursor.unacked.append(entry_id)
                await self._forget(key, cursor)
                if len(entries or []) < PAGE:
                    return
        except Exception:
            with contextlib.suppress(Exception):  # else the next round (or a reconnect) does
                await self._forget(key, cursor)
            raise

    def _start(self, cursor: DrainCursor) -> str:
        """The XRANGE start: after the cursor, and never before the retention's first id."""
        after = f"({cursor.after}" if cursor.after != "-" else "-"
        if self.retention_s is None:
            return after
        minid = outbox_minid(time.time(), self.retention_s)
        if cursor.after != "-" and int(cursor.after.split("-", 1)[0]) >= minid:
            return after
        return str(minid)

    async def _forget(self, key: str, cursor: DrainCursor) -> None:
        """Delete the messages sent (auto-ack); kept in ``cursor`` until that succeeded."""
        if cursor.unacked:
            sent = list(cursor.unacked)
            await self.mux.command("XDEL", key, *sent)
            del cursor.unacked[: len(sent)]

    async def ack(self, backend_id: str, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self.mux.command("XDEL", self.keys.outbox(backend_id), *entry_ids))
