"""One call of a model service: ``base_url + route`` by GET (payload as query) or POST (JSON).

This is the worker's hot path, so it uses aiohttp (see ``bench/http_clients.py``: about ten
times the requests per CPU second of httpx here) over one keep-alive session per process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from aigcq.asynch.headmsg import merge_headers
from aigcq.asynch.models_repo import ModelConfig

TASK_ID_HEADER = "X-Asynch-Task-Id"
#: Connections to model services kept open at once (per process).
MAX_CONNECTIONS = 1000
#: Largest reply by default (``AIGCQ_ASYNCH_REPLY_MAX_BYTES``).
DEFAULT_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Reply:
    content: bytes
    content_type: str


class CallError(Exception):
    """The call failed; ``called`` tells whether the request reached the model service."""

    def __init__(self, message: str, *, called: bool) -> None:
        super().__init__(message)
        self.called = called


def model_session() -> aiohttp.ClientSession:
    """The keep-alive session for model calls; create it inside the running event loop."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
    )


async def call_model(
    session: aiohttp.ClientSession,
    model: ModelConfig,
    task_id: str,
    payload: Any,
    model_key: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Reply:
    """Call the model service once; raises :class:`CallError` on any failure.

    ``timeout_seconds`` bounds the whole call: connecting, sending and every byte of the
    reply (a server that drips its reply slowly is cut off at the deadline). A reply longer
    than ``max_bytes`` fails the call as soon as that is known (its Content-Length, or the
    bytes read so far). A request that could not connect (refused, unreachable, connect
    timeout) did not reach the service.
    """
    headers = {**merge_headers(model.head_msg, model_key), TASK_ID_HEADER: task_id}
    seconds = float(model.timeout_seconds)
    timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=seconds)
    try:
        async with session.request(
            model.http_method,
            model.url,
            headers=headers,
            timeout=timeout,
            **_body(model.http_method, payload),
        ) as response:
            status = response.status
            length = response.content_length
            if length is not None and length > max_bytes:
                raise ReplyTooLarge(length)
            if length is not None:
                content = await response.read()
            else:
                content = await _read_bounded(response, max_bytes)
            content_type = response.headers.get("Content-Type", "application/octet-stream")
    except ReplyTooLarge as exc:
        message = f"model reply is larger than the limit of {max_bytes} bytes ({exc.size}"
        message += " bytes announced)" if exc.announced else "+ bytes)"
        raise CallError(message, called=True) from None
    except aiohttp.ConnectionTimeoutError as exc:
        message = f"cannot connect to {model.url}: no connection within {seconds:g} s"
        raise CallError(message, called=False) from exc
    except aiohttp.ClientConnectorError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc.os_error)
        raise CallError(f"cannot connect to {model.url}: {reason}", called=False) from exc
    except (aiohttp.SocketTimeoutError, TimeoutError) as exc:
        message = f"{model.http_method} {model.url}: no complete reply within {seconds:g} s"
        raise CallError(message, called=True) from exc
    except aiohttp.ClientError as exc:
        message = f"{model.http_method} {model.url}: {exc or type(exc).__name__}"
        raise CallError(message, called=True) from exc
    if status >= 300:
        snippet = content.decode("utf-8", errors="replace")[:500]
        raise CallError(f"model service HTTP {status}: {snippet}", called=True)
    return Reply(content, content_type)


class ReplyTooLarge(Exception):
    def __init__(self, size: int, *, announced: bool = True) -> None:
        super().__init__(size)
        self.size = size
        self.announced = announced


async def _read_bounded(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body of a reply without a Content-Length (chunked), failing past ``max_bytes``."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(max_bytes, announced=False)
        parts.append(chunk)
    return b"".join(parts)


def _body(method: str, payload: Any) -> dict[str, Any]:
    if method == "POST":
        return {"json": payload}
    if isinstance(payload, dict):
        return {
            "params": {k: v if isinstance(v, str) else json.dumps(v) for k, v in payload.items()}
        }
    return {"params": {"payload": json.dumps(payload)}}
