"""One Redis pub/sub subscription per process, fanning cluster-wide events out locally.

Messages on ``{prefix}:events``: ``wake`` (something to dispatch), ``outbox:<backendId>``
(a client has a new message), ``client:<backendId>:<connId>`` (a client connected) and
``progress:{"backendId":..,"message":{..}}`` (live news for a client, never stored) and
``bridge-end:{"bridgeId":..,"taskId":..,"failures":..}`` (a TASK_END received here for a
bridge connected to another process: that process frees the slot at once) and
``capacity`` (a process's free bridge slots grew: read them now, see
:mod:`aigcq.bridges.peers`).
Pub/sub may drop messages while reconnecting; the periodic sweeps cover that gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.plumbing.background import round_failed, round_ok
from aigcq.plumbing.text import text

log = logging.getLogger(__name__)


@dataclass(eq=False)
class EventBus:
    redis: Redis
    channel: str
    _: KW_ONLY
    on_wake: Callable[[], None]
    on_outbox: Callable[[str], None]
    on_client: Callable[[str, str], None]
    on_progress: Callable[[str, dict[str, Any]], None]
    on_bridge_end: Callable[[dict[str, Any]], None] = lambda end: None
    on_capacity: Callable[[], None] = lambda: None

    async def run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                round_failed(log, "event subscription lost, resubscribing", exc)
                await asyncio.sleep(1.0)

    async def _listen(self) -> None:
        async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            await pubsub.subscribe(self.channel)
            round_ok(log, "event subscription lost, resubscribing")
            self.on_wake()  # catch up on anything published while we were away
            async for message in pubsub.listen():
                self._handle(text(message["data"]))

    def _handle(self, data: str) -> None:
        """Hand one event on; never waits (on a socket, on Redis): one slow peer must
        not hold every other client's events."""
        kind, _, rest = data.partition(":")
        if kind == "wake":
            self.on_wake()
        elif kind == "outbox":
            self.on_outbox(rest)
        elif kind == "client":
            backend_id, _, conn_id = rest.rpartition(":")
            self.on_client(backend_id, conn_id)
        elif kind == "progress":
            body = orjson.loads(rest)
            self.on_progress(body["backendId"], body["message"])
        elif kind == "bridge-end":
            self.on_bridge_end(orjson.loads(rest))
        elif kind == "capacity":
            self.on_capacity()


async def publish_progress(
    redis: Redis, channel: str, backend_id: str, message: dict[str, Any]
) -> None:
    """Send ``message`` to ``backend_id``'s socket, whichever process holds it (best effort)."""
    if not backend_id:
        return
    body = progress_event(backend_id, message)
    try:
        await redis.publish(channel, f"progress:{body}")
    except Exception as exc:  # progress is optional: never fail the caller for it
        log.warning("progress for %s not published: %r", backend_id, exc)


def running_message(task_id: str, target: str) -> dict[str, Any]:
    return {"type": "progress", "taskId": task_id, "state": "running", "target": target}


def progress_event(backend_id: str, message: dict[str, Any]) -> str:
    """The body of a ``progress:`` event (for scripts that publish it themselves)."""
    if not backend_id:
        return ""
    return orjson.dumps({"backendId": backend_id, "message": message}).decode()


def bridge_end_event(end: dict[str, Any]) -> str:
    return "bridge-end:" + orjson.dumps(end).decode()
