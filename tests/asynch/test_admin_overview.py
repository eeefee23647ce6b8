"""``GET /admin/overview``: the dashboard's read-only view of model-asynch, admin token only."""

from __future__ import annotations

import httpx

from aigcq.asynch.app import create_app
from aigcq.asynch.runtime import runtime_max_concurrency_key
from aigcq.serve.admin_panels import AsynchPanel
from tests.fakes.asynch import Asynch
from tests.fakes.servers import serve_app

TOKEN = "asynch-admin-token"


async def test_overview_lists_models_limits_use_and_recent_tasks(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9", queueLimit=5, maxConcurrency=2)
    await asynch.create_model("off", "http://127.0.0.1:9", enabled=0)
    ids = [f"task-{i}" for i in range(3)]
    for task_id in ids:  # queued rows holding a gate slot, as createTask leaves them
        await asynch.db.execute(
            "INSERT INTO asynch_task (task_id, model_name, tenant_id, request_payload)"
            " VALUES (%s, 'm', 't1', '{}')",
            (task_id,),
        )
        assert await asynch.svc.gate.take("m", task_id, 5)
    await asynch.redis.set(runtime_max_concurrency_key("m"), 1)
    assert await asynch.svc.semaphore.acquire("m", "t1", ids[0], 2)

    assert (await asynch.call("GET", "/admin/overview")).status_code == 403  # no token set
    app = create_app(asynch.svc, admin_token=TOKEN)
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/admin/overview")).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await http.get("/admin/overview", headers=bad)).status_code == 401
        r = await http.get("/admin/overview", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        body = r.json()
        panel = await AsynchPanel(url, TOKEN).read()  # what `aigcq serve` puts in a snapshot
        assert panel is not None and panel["error"] is None and panel["models"] == body["models"]
        wrong = await AsynchPanel(url, "nope").read()
        assert wrong is not None and wrong["error"].startswith("HTTP 401")

    models = {m["modelName"]: m for m in body["models"]}
    m = models["m"]
    assert (m["enabled"], m["queueLimit"], m["maxConcurrency"]) == (True, 5, 2)
    assert (m["gateUsed"], m["runtimeMaxConcurrency"], m["runtimeQueueLimit"]) == (3, 1, None)
    assert m["semaphoreUsed"] == 1 and m["semaphoreByTenant"] == {"t1": 1}
    assert models["off"]["enabled"] is False and models["off"]["gateUsed"] == 0
    assert body["taskCounts"] == {"queued": 3}
    assert [t["taskId"] for t in body["recent"]] == ids[::-1]
    assert body["recent"][0]["state"] == "queued" and body["recent"][0]["modelName"] == "m"
