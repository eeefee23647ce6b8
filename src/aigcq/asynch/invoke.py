"""One call of a model service: ``base_url + route`` by GET (payload as query) or POST (JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from aigcq.asynch.headmsg import merge_headers
from aigcq.asynch.models_repo import ModelConfig

TASK_ID_HEADER = "X-Asynch-Task-Id"


@dataclass(frozen=True)
class Reply:
    content: bytes
    content_type: str


class CallError(Exception):
    """The call failed; ``called`` tells whether the request reached the model service."""

    def __init__(self, message: str, *, called: bool) -> None:
        super().__init__(message)
        self.called = called


async def call_model(
    client: httpx.AsyncClient, model: ModelConfig, task_id: str, payload: Any, model_key: str
) -> Reply:
    """Call the model service once; raises :class:`CallError` on any failure."""
    headers = {**merge_headers(model.head_msg, model_key), TASK_ID_HEADER: task_id}
    request = client.build_request(
        model.http_method,
        model.url,
        headers=headers,
        timeout=float(model.timeout_seconds),
        **_body(model.http_method, payload),
    )
    try:
        response = await client.send(request)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise CallError(f"cannot connect to {model.url}: {exc!r}", called=False) from exc
    except httpx.HTTPError as exc:
        raise CallError(f"{model.http_method} {model.url}: {exc!r}", called=True) from exc
    if response.status_code >= 300:
        snippet = response.text[:500]
        raise CallError(f"model service HTTP {response.status_code}: {snippet}", called=True)
    content_type = response.headers.get("content-type", "application/octet-stream")
    return Reply(response.content, content_type)


def _body(method: str, payload: Any) -> dict[str, Any]:
    if method == "POST":
        return {"json": payload}
    if isinstance(payload, dict):
        return {
            "params": {k: v if isinstance(v, str) else json.dumps(v) for k, v in payload.items()}
        }
    return {"params": {"payload": json.dumps(payload)}}
