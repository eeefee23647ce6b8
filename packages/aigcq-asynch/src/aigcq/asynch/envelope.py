"""Every error in the API's envelope, whatever raised it.

:class:`ErrorEnvelope` is the outermost middleware of the asynch app. It answers

* a query string holding a NUL character (``%00``): ``INVALID_ARGUMENT`` before any handler;
* :class:`AsynchError`: its code and status;
* PostgreSQL or Redis unreachable (a connection refused or lost, no pooled connection within
  ``DB_ACQUIRE_TIMEOUT_SECONDS``, Redis state that could not be rebuilt): ``UNAVAILABLE`` 503
  with ``Retry-After`` and one warning line, no traceback;
* a value PostgreSQL refuses to store (:class:`psycopg.DataError`): ``INVALID_ARGUMENT``;
* anything else: ``INTERNAL_ERROR`` 500, logged once with its traceback (a bug).

Nothing is answered twice: an error after the response started is re-raised.
"""

from __future__ import annotations

import logging

import psycopg
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aigcq.asynch.errors import RETRY_AFTER_SECONDS, AsynchError, Code
from aigcq.asynch.http import error_response
from aigcq.asynch.rebuild import RedisStateLost
from aigcq.asynch.tasks_repo import PG_OUTAGE
from aigcq.plumbing.background import REDIS_OUTAGE

log = logging.getLogger(__name__)


def as_envelope(exc: Exception, method: str, path: str) -> AsynchError:
    """The refusal an exception that escaped a handler is answered with."""
    if isinstance(exc, AsynchError):
        return exc
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if isinstance(exc, (*REDIS_OUTAGE, RedisStateLost)):
        log.warning("%s %s: Redis unavailable (%s)", method, path, exc)
        return AsynchError(Code.UNAVAILABLE, "Redis is unavailable; try again", retry)
    if isinstance(exc, psycopg.DataError):
        reason = exc.diag.message_primary or type(exc).__name__
        log.info("%s %s: PostgreSQL refused a value: %s", method, path, reason)
        return AsynchError(Code.INVALID_ARGUMENT, f"a value cannot be stored: {reason}")
    if isinstance(exc, PG_OUTAGE):
        log.warning("%s %s: PostgreSQL unavailable (%s)", method, path, exc)
        return AsynchError(Code.UNAVAILABLE, "PostgreSQL is unavailable; try again", retry)
    log.error("%s %s failed", method, path, exc_info=exc)
    return AsynchError(Code.INTERNAL_ERROR, "internal error (logged)")


class ErrorEnvelope:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if b"%00" in scope.get("query_string", b""):
            error = AsynchError(Code.INVALID_ARGUMENT, "a query parameter holds a NUL (%00)")
            await error_response(error)(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:
                raise
            error = as_envelope(exc, scope["method"], scope["path"])
            await error_response(error)(scope, receive, send)
