"""The envelope on every error (bad input, outages, size, auth) and what a Go client sends."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aigcq.asynch.settings import AsynchSettings
from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.storage import StorageSettings
from tests.fakes.asynch import Asynch, Served, fast_settings, open_asynch, refusal
from tests.fakes.waiting import wait_until

TASK = {"modelName": "m", "requestPayload": {"p": 1}, "bizName": "b"}


def _envelope(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    return refusal(response, code)


async def test_every_reply_has_the_go_services_numeric_code(
    asynch: Asynch, model_emu: Served
) -> None:
    """A Go caller decodes ``{Code int}`` and checks ``Code != 0`` (issue 30 item 1): 0 on
    success, GoFrame's gcode number of the class otherwise, the exact reason beside it."""
    body = {"modelName": "m", "baseUrl": model_emu.url}
    for method, path, kwargs in [
        ("POST", "/model/createModel", {"json": body}),
        ("GET", "/model/getModel", {"params": {"modelName": "m"}}),
        ("GET", "/model/listModel", {}),
        ("POST", "/task/createTask", {"json": TASK}),
        ("GET", "/health", {}),
    ]:
        reply = (await asynch.call(method, path, **kwargs)).json()
        assert reply["code"] == 0 and type(reply["code"]) is int and "reason" not in reply, path
    for method, path, kwargs, status, number, reason in [
        ("GET", "/model/getModel", {"params": {"modelName": "x"}}, 404, 65, "MODEL_NOT_FOUND"),
        ("POST", "/task/createTask", {"content": b"{"}, 400, 51, "INVALID_ARGUMENT"),
        ("POST", "/model/createModel", {"json": body}, 409, 300, "MODEL_EXISTS"),
        ("GET", "/task/createTask", {}, 405, 66, "METHOD_NOT_ALLOWED"),
        ("GET", "/nowhere", {}, 404, 65, "NOT_FOUND"),
        ("GET", "/admin/overview", {}, 403, 61, "FORBIDDEN"),
    ]:
        response = await asynch.call(method, path, **kwargs)
        reply = response.json()
        assert response.status_code == status, response.text
        assert (reply["code"], reply["reason"], reply["data"]) == (number, reason, None)
        assert reply["message"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/task/createTask", {**TASK, "bizName": "a\u0000"}, "bizName"),
        ("/task/createTask", {**TASK, "requestPayload": {"x": ["ok", "\u0000"]}}, "x[1]"),
        ("/task/createTask", {**TASK, "requestPayload": {"k\u0000": 1}}, "requestPayload.k"),
        ("/model/updateModel", {"modelName": "m", "remark": "\u0000"}, "remark"),
        ("/model/type/createModelType", {"type": "t", "promptInfo": "a\u0000"}, "promptInfo"),
    ],
)
async def test_nul_characters_are_refused_in_the_envelope(
    asynch: Asynch, model_emu: Served, path: str, body: dict[str, Any], field: str
) -> None:
    await asynch.create_model("m", model_emu.url)
    message = _envelope(await asynch.call("POST", path, json=body), 400, "INVALID_ARGUMENT")
    assert field in message and "NUL" in message
    cur = await asynch.db.execute("SELECT count(*) FROM asynch_task")
    assert (await cur.fetchone()) == (0,)


async def test_a_nul_in_the_decoded_user_info_is_dropped(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url)
    info = base64.b64encode(b'{"tenantId": "t\\u0000x", "userId": "\\u0000"}').decode()
    task_id = await asynch.create_task("m", headers={"X-User-Info": info})
    cur = await asynch.db.execute(
        "SELECT tenant_id, creator FROM asynch_task WHERE task_id = %s", (task_id,)
    )
    assert await cur.fetchone() == ("tx", "anonymous")


async def test_huge_numbers_and_nul_queries_are_400(asynch: Asynch) -> None:
    for path, params in [
        ("/model/listModel", {"page": 10**30}),
        ("/model/type/listModelType", {"page": 2**62}),
        ("/model/type/getModelType", {"typeId": 2**40}),
        ("/model/getModel", {"modelName": "a\u0000"}),
        ("/task/getTaskResult", {"taskId": "\u0000"}),
    ]:
        response = await asynch.call("GET", path, params=params)
        _envelope(response, 400, "INVALID_ARGUMENT")
    _envelope(await asynch.call("GET", "/files/a%00b"), 404, "FILE_NOT_FOUND")
    response = await asynch.call("POST", "/model/autoTune", json={"windowSeconds": 1e15})
    assert "windowSeconds" in _envelope(response, 400, "INVALID_ARGUMENT")


async def test_a_chunked_body_over_the_limit_is_413(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url)
    limit = asynch.svc.settings.max_payload_bytes

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"modelName": "m", "bizName": "b", "requestPayload": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    response = await asynch.call("POST", "/task/createTask", content=chunks())
    _envelope(response, 413, "PAYLOAD_TOO_LARGE")


async def test_create_task_during_a_redis_outage_is_503(
    pg_url: str,
    db: psycopg.AsyncConnection[Any],
    private_redis: EmbeddedRedis,
    model_emu: Served,
    tmp_path: Path,
) -> None:
    storage = StorageSettings(kind="local", local_dir=tmp_path / "files")
    async with open_asynch(pg_url, private_redis.url, db, tmp_path, fast_settings(), storage) as a:
        await a.create_model("m", model_emu.url)
        private_redis.stop()
        try:
            response = await a.call("POST", "/task/createTask", json=TASK)
        finally:
            private_redis.start()
        assert "Redis" in _envelope(response, 503, "UNAVAILABLE")
        assert response.headers["retry-after"] == "2"
        await _works_again(a)


async def _works_again(asynch: Asynch) -> None:
    async def accepted() -> bool:
        return (await asynch.call("POST", "/task/createTask", json=TASK)).status_code == 200

    await wait_until(accepted, 30, 0.2, what="createTask working again after the outage")


@pytest.fixture
def asynch_settings() -> AsynchSettings:
    return fast_settings(db_acquire_timeout_seconds=1.0)


async def test_create_task_during_a_postgres_outage_is_503(
    asynch: Asynch, pg_server: EmbeddedPostgres, model_emu: Served
) -> None:
    await asynch.create_model("m", model_emu.url)
    await asynch.db.close()
    pg_server.stop()
    try:
        responses = [await asynch.call("POST", "/task/createTask", json=TASK) for _ in range(2)]
    finally:
        pg_server.start()
    for response in responses:
        assert "PostgreSQL" in _envelope(response, 503, "UNAVAILABLE")
        assert response.headers["retry-after"] == "2"
    await _works_again(asynch)


async def test_management_routes_need_the_admin_token_when_set(
    asynch: Asynch, model_emu: Served
) -> None:
    asynch.svc.settings.admin_token = "s3cret"
    body = {"modelName": "m", "baseUrl": model_emu.url}
    for path in ("/model/createModel", "/task/runWork", "/task/cleanWork", "/model/autoTune"):
        response = await asynch.call("POST", path, json=body)
        _envelope(response, 401, "UNAUTHORIZED")
    wrong = {"Authorization": "Bearer nope"}
    _envelope(await asynch.call("GET", "/model/listModel", headers=wrong), 401, "UNAUTHORIZED")
    await asynch.ok("POST", "/model/createModel", json=body, headers={"X-Admin-Token": "s3cret"})
    await asynch.ok(
        "GET", "/model/getModel?modelName=m", headers={"Authorization": "Bearer s3cret"}
    )
    await asynch.create_task("m")  # the task routes are the business's, no admin token


async def test_the_model_host_allow_list(asynch: Asynch) -> None:
    asynch.svc.settings.model_hosts = "127.0.0.1, *.example.com, 10.1.0.0/16"
    for url in ("http://127.0.0.1:9", "https://gpu.example.com", "http://10.1.2.3"):
        await asynch.ok("POST", "/model/createModel", json={"modelName": "m", "baseUrl": url})
        await asynch.ok("POST", "/model/deleteModel", json={"modelName": "m"})
    for url in ("http://10.2.0.1", "http://example.com.evil.io", "http://169.254.169.254"):
        response = await asynch.call(
            "POST", "/model/createModel", json={"modelName": "m", "baseUrl": url}
        )
        _envelope(response, 403, "MODEL_HOST_NOT_ALLOWED")


async def test_a_go_client_gets_the_go_services_answers(asynch: Asynch, model_emu: Served) -> None:
    # a Go struct marshalled with zero values and nil pointers, plus a field we do not know
    created = await asynch.ok("POST", "/model/createModel", json={
        "modelName": "m", "modelsType": "", "form": None, "baseUrl": model_emu.url,
        "route": "/gen", "httpMethod": "", "headMsg": "", "enabled": 1, "maxConcurrency": 0,
        "queueLimit": 0, "timeoutSeconds": 0, "expectedSeconds": 0, "retryTimes": 0,
        "retryQueueMaxSeconds": 0, "autoCleanSeconds": 3600, "remark": "", "tenant": "x",
    })  # fmt: skip
    assert (created["maxConcurrency"], created["queueLimit"]) == (1, 100)
    assert (created["timeoutSeconds"], created["httpMethod"]) == (1800, "POST")
    # getModel's output echoed into updateModel (id, createdAt … are ignored)
    got = await asynch.ok("GET", "/model/getModel", params={"modelName": "m"})
    updated = await asynch.ok("POST", "/model/updateModel", json={**got, "remark": "echo"})
    assert updated["remark"] == "echo" and updated["queueLimit"] == 100
    zeroes = {"modelName": "m", "maxConcurrency": 0, "baseUrl": "", "timeoutSeconds": None}
    assert (await asynch.ok("POST", "/model/updateModel", json=zeroes))["maxConcurrency"] == 1
    task_id = await asynch.create_task("m", callbackUrl="", modelKey=None, extra={"a": 1})
    assert await asynch.wait_state(task_id, 2) == 2
    batch = await asynch.ok("POST", "/task/runWork", json={"batchSize": 0})
    assert batch["claimed"] == 0
    # strict types stay
    for field, value in [("maxConcurrency", "5"), ("queueLimit", True), ("enabled", 1.0)]:
        response = await asynch.call(
            "POST", "/model/updateModel", json={"modelName": "m", field: value}
        )
        assert field in _envelope(response, 400, "INVALID_ARGUMENT")


async def test_the_openapi_documents_bodies_and_errors(asynch: Asynch) -> None:
    spec = (await asynch.call("GET", "/openapi.json")).json()
    for path, methods in spec["paths"].items():
        if not path.startswith(("/model/", "/task/")):
            continue
        for method, operation in methods.items():
            assert {"200", "400", "500", "503"} <= set(operation["responses"]), (path, method)
            if method == "post" and path not in ("/task/cleanWork",):
                assert "requestBody" in operation, path
    create = spec["paths"]["/task/createTask"]["post"]
    ref = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "bizName" in spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
