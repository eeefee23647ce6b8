"""Sync of model types to prompts-core: ``POST {prompts_core}/prompt/createPrompt``.

Field mapping (seed): typeId → modelTypeId, type → modelType, promptInfo, responseJsonSchema,
version. A non-2xx answer, or a JSON body whose ``code`` is not 0/200, is a failure.
"""

from __future__ import annotations

from typing import Any

import httpx

from aigcq.asynch.db import Row
from aigcq.asynch.errors import AsynchError, Code

_OK_CODES = (None, 0, 200, "0", "200")


def prompt_body(row: Row) -> dict[str, Any]:
    return {
        "modelTypeId": row["type_id"],
        "modelType": row["type"],
        "promptInfo": row["prompt_info"],
        "responseJsonSchema": row["response_json_schema"],
        "version": row["version"],
    }


async def create_prompt(client: httpx.AsyncClient, base_url: str, row: Row) -> None:
    """Push one model type; raises ``PROMPTS_CORE_SYNC_FAILED`` with the reason."""
    if not base_url:
        raise AsynchError(
            Code.PROMPTS_CORE_SYNC_FAILED,
            "prompts-core is not configured (AIGCQ_ASYNCH_PROMPTS_CORE_URL)",
        )
    url = f"{base_url.rstrip('/')}/prompt/createPrompt"
    try:
        response = await client.post(url, json=prompt_body(row), timeout=10.0)
    except httpx.HTTPError as exc:
        raise AsynchError(Code.PROMPTS_CORE_SYNC_FAILED, f"{url}: {exc!r}") from exc
    code = _code_of(response)
    if response.status_code >= 300 or code not in _OK_CODES:
        raise AsynchError(
            Code.PROMPTS_CORE_SYNC_FAILED,
            f"{url}: HTTP {response.status_code}, code {code!r}: {response.text[:300]}",
        )


def _code_of(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None
