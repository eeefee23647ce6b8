"""``GET /admin/overview``: a read-only view of model-asynch for the aigcq dashboard.

Models (configured caps and autoTune's runtime values), queue-limit gate and concurrency
semaphore use (live Redis state), task counts by state and the most recent tasks. Protected
by ``AIGCQ_ADMIN_TOKEN`` as a Bearer token; without a configured admin token the endpoint is
refused (403), as there is nothing to check a caller against.

``aigcq serve`` with ``AIGCQ_ASYNCH_URL`` reads it once per dashboard snapshot (see
:mod:`aigcq.serve.admin_panels`).
"""

from __future__ import annotations

import hmac
import time
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.http import error_response
from aigcq.asynch.process import AsynchProcess
from aigcq.asynch.runtime import (
    gate_key,
    runtime_max_concurrency_key,
    runtime_queue_limit_key,
    semaphore_key,
)
from aigcq.plumbing.auth import bearer

RECENT = 15
NO_TOKEN = "no admin token set: set AIGCQ_ADMIN_TOKEN (the one `aigcq serve` uses) here too"
TOKEN_REQUIRED = "admin token required: send AIGCQ_ADMIN_TOKEN as Authorization: Bearer"
MAX_MODELS = 200
STATES = {0: "queued", 1: "running", 2: "succeeded", 3: "failed", 4: "downloaded"}


def overview_router(admin_token: str) -> APIRouter:
    router = APIRouter(tags=["admin"])

    @router.get("/admin/overview", summary="Models, gate / semaphore use, recent tasks")
    async def admin_overview(request: Request) -> Response:
        if not admin_token:
            return error_response(AsynchError(Code.FORBIDDEN, NO_TOKEN))
        given = bearer(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(given.encode(), admin_token.encode()):
            return error_response(AsynchError(Code.UNAUTHORIZED, TOKEN_REQUIRED))
        svc: AsynchProcess | None = request.app.state.asynch
        if svc is None:
            return error_response(AsynchError(Code.UNAVAILABLE, "starting"))
        return JSONResponse(await overview(svc))

    return router


async def overview(svc: AsynchProcess) -> dict[str, Any]:
    models = await svc.models.list_models(None, 0, MAX_MODELS)
    names = [str(m["model_name"]) for m in models]
    now = time.time()
    redis = svc.redis
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.get(runtime_max_concurrency_key(name))
        pipe.get(runtime_queue_limit_key(name))
        pipe.zcard(gate_key(name))
    values = await pipe.execute() if names else []
    semaphores: dict[str, dict[str, int]] = {}
    prefix = semaphore_key("", "")[:-1]  # "asynch:sem:"
    async for raw in redis.scan_iter(match=f"{prefix}*", count=500):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        model, _, tenant = key[len(prefix) :].partition(":")
        live = int(await redis.zcount(key, now, "+inf"))
        if live:
            semaphores.setdefault(model, {})[tenant] = live
    rows = []
    for i, m in enumerate(models):
        rt_conc, rt_limit, gate_used = values[3 * i : 3 * i + 3]
        name = str(m["model_name"])
        rows.append(
            {
                "modelName": name,
                "enabled": bool(m["enabled"]),
                "maxConcurrency": int(m["max_concurrency"]),
                "queueLimit": int(m["queue_limit"]),
                "runtimeMaxConcurrency": _int(rt_conc),
                "runtimeQueueLimit": _int(rt_limit),
                "gateUsed": int(gate_used),
                "semaphoreUsed": sum(semaphores.get(name, {}).values()),
                "semaphoreByTenant": semaphores.get(name, {}),
            }
        )
    async with svc.pool.connection() as conn:
        cur = await conn.execute("SELECT state, count(*) AS n FROM asynch_task GROUP BY state")
        counts = {
            STATES.get(int(r["state"]), str(r["state"])): int(r["n"]) for r in await cur.fetchall()
        }
        cur = await conn.execute(
            "SELECT task_id, model_name, tenant_id, biz_name, state, retry_count,"
            " created_at, finished_at FROM asynch_task ORDER BY id DESC LIMIT %s",
            (RECENT,),
        )
        recent = [_task(r) for r in await cur.fetchall()]
    callbacks = await svc.callbacks.counts()
    return {
        "time": now,
        "models": rows,
        "taskCounts": counts,
        "callbacks": callbacks,
        "recent": recent,
    }


def _task(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "taskId": r["task_id"],
        "modelName": r["model_name"],
        "tenantId": r["tenant_id"],
        "bizName": r["biz_name"],
        "state": STATES.get(int(r["state"]), str(r["state"])),
        "retryCount": int(r["retry_count"] or 0),
        "created": _ts(r["created_at"]),
        "finished": _ts(r["finished_at"]),
    }


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
