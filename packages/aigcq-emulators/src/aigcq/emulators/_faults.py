"""Faults a paid-platform emulator can be told to inject (``POST /_emulator/faults``).

* ``drop_create_replies``: the next N creates are accepted (the task runs and is billed),
  then the connection breaks before the reply is complete: a lost reply;
* ``gateway_create_replies``: the next N creates are accepted (the task runs and is billed)
  and answered by a gateway's HTML 502 instead, as a proxy in front of the platform
  answers when its upstream was slow;
* ``full_create_replies``: the next N creates are refused as full (RunningHub's 421),
  after ``delay_create_reply_s`` like an accepted one;
* ``delay_create_reply_s``: creates are accepted at once, their reply sent this much later;
* ``status_faults``: the next status / outputs / run-history answers, in order, are one of
  ``5xx`` (HTTP 502, an HTML body), ``non_json`` (HTTP 200, not JSON), ``unknown_code``
  (HTTP 200, a code the API does not document);
* ``cancel_delay_s``: a cancel is acknowledged at once, the task ends this much later;
* ``ghost_tasks``: tasks the platform counts as running on every key that no create of
  this API made (another client of the key, a create lost long ago): in RunningHub's
  ``accountStatus`` and queue status, not against its ``max_concurrent``;
* ``account_status_faults``: the next N account / queue status answers are HTTP 502;
* ``late_webhooks``: the next N tasks that end send their webhook ``late_webhook_s`` late
  (a delivery RunningHub retried for a while), after the task's deadline, a cancel or a
  retry elsewhere have moved it on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

STATUS_FAULTS = frozenset({"5xx", "non_json", "unknown_code"})
GATEWAY_PAGE = b"<html>502 Bad Gateway</html>"


@dataclass
class Faults:
    """The faults in force (see the module docstring for each)."""

    drop_create_replies: int = 0  # accepted, their reply lost
    status_faults: list[str] = field(default_factory=list)
    gateway_create_replies: int = 0  # accepted, answered by a gateway's HTML 502
    delay_create_reply_s: float = 0.0
    full_create_replies: int = 0  # refused as full, after delay_create_reply_s
    cancel_delay_s: float = 0.0
    ghost_tasks: int = 0
    account_status_faults: int = 0
    late_webhooks: int = 0
    late_webhook_s: float = 0.0

    def update(self, body: Any) -> dict[str, Any]:
        """Apply a ``/_emulator/faults`` body; the faults now in force."""
        if isinstance(body, dict):
            for f in fields(self):
                if f.name in body:
                    setattr(self, f.name, type(getattr(self, f.name))(body[f.name]))
        self.status_faults = [s for s in self.status_faults if s in STATUS_FAULTS]
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def take_full(self) -> bool:
        """Whether this create is to be refused as full (``full_create_replies``)."""
        if self.full_create_replies <= 0:
            return False
        self.full_create_replies -= 1
        return True

    def webhook_delay_s(self) -> float:
        """How late the webhook of a task that ends now is sent (``late_webhooks``)."""
        if self.late_webhooks <= 0:
            return 0.0
        self.late_webhooks -= 1
        return self.late_webhook_s

    def create_fault(self) -> Response | None:
        """The faulty answer to a create that was accepted, if one is due: a lost reply
        (``drop_create_replies``) or a gateway's page (``gateway_create_replies``)."""
        if self.drop_create_replies > 0:
            self.drop_create_replies -= 1
            return BrokenReply()
        if self.gateway_create_replies > 0:
            self.gateway_create_replies -= 1
            return Response(GATEWAY_PAGE, 502, media_type="text/html")
        return None

    def account_fault(self) -> Response | None:
        """A gateway's 502 instead of the next account status, if one is due."""
        if self.account_status_faults <= 0:
            return None
        self.account_status_faults -= 1
        return Response(GATEWAY_PAGE, 502, media_type="text/html")

    def status_fault(self) -> Response | None:
        """The faulty answer to send instead of the next status query, if any."""
        if not self.status_faults:
            return None
        kind = self.status_faults.pop(0)
        if kind == "5xx":
            return Response(GATEWAY_PAGE, 502, media_type="text/html")
        if kind == "non_json":
            return Response(b"<html>maintenance</html>", 200, media_type="text/html")
        body = {"code": 9999, "msg": "SYSTEM_BUSY_UNDOCUMENTED", "data": None}
        return Response(orjson.dumps(body), 200, media_type="application/json")


class BrokenReply(Response):
    """Starts a reply, then breaks the connection before its body: the request was
    handled, the client never learns how."""

    def __init__(self) -> None:
        super().__init__(b"", 200, media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"code":0', "more_body": True})
        raise ConnectionAbortedError("emulated lost reply")
