"""``/docs`` works offline and the OpenAPI document says what the API answers: every
request body, every error status with aigcq's error envelope, not FastAPI's own 422."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.servers import serve_app

SECRET = "openapi-secret-with-at-least-32-bytes"


@pytest.fixture
async def http(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url, token_secret=SECRET, config_dir=tmp_path, admin_token="adm",
        max_payload_bytes=1000,
    )  # fmt: skip
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base, httpx.AsyncClient(base_url=base) as client:
        yield client


async def test_docs_page_loads_its_assets_from_the_server(http: httpx.AsyncClient) -> None:
    page = await http.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)""", page.text)
    assert urls and all(u.startswith("/") for u in urls), urls  # nothing from a CDN
    for url in urls:
        asset = await http.get(url)
        assert asset.status_code == 200 and len(asset.content) > 1000, url
    assert (await http.get("/docs/assets/secrets.json")).status_code == 404


async def test_openapi_documents_bodies_and_real_error_statuses(http: httpx.AsyncClient) -> None:
    schema: dict[str, Any] = (await http.get("/openapi.json")).json()
    submit = schema["paths"]["/api/tasks"]["post"]
    body = submit["requestBody"]["content"]["application/json"]["schema"]
    assert {"taskId", "platform", "payload"} <= set(body["required"])
    assert {"400", "401", "409", "413", "422"} <= set(submit["responses"])  # 422: PlatformError
    assert "PlatformError" in submit["responses"]["422"]["description"]
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            assert "HTTPValidationError" not in str(operation["responses"]), path
    error = schema["components"]["schemas"]["ErrorBody"]
    assert {"code", "msg"} <= set(error["required"])


async def test_each_documented_error_has_the_documented_body(http: httpx.AsyncClient) -> None:
    token = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    answers = {
        401: await http.get("/api/queues"),
        400: await http.get("/api/tasks", params={"limit": "many"}, headers=token),
        404: await http.get("/api/tasks/nope", headers=token),
        413: await http.post("/api/tasks", content=b"x" * 2000, headers=token),
    }
    for status, resp in answers.items():
        assert resp.status_code == status, (status, resp.text)
        body = resp.json()
        assert body["type"] == "error" and body["code"] and body["msg"], body
    assert answers[400].json()["code"] == "JSONError"
    assert "limit" in answers[400].json()["detail"]


async def test_routes_name_the_tokens_they_take(http: httpx.AsyncClient) -> None:
    """/docs gets an Authorize button: Bearer schemes, and each route says which it takes."""
    schema: dict[str, Any] = (await http.get("/openapi.json")).json()
    schemes = schema["components"]["securitySchemes"]
    assert {s["scheme"] for s in schemes.values()} == {"bearer"}, schemes
    assert {"clientToken", "adminToken"} <= set(schemes)
    paths = schema["paths"]
    assert paths["/api/tasks"]["post"]["security"] == [{"clientToken": []}, {"adminToken": []}]
    assert paths["/api/admin/snapshot"]["get"]["security"] == [{"adminToken": []}]
    workflow = paths["/api/workflows/{workflow_id}"]
    assert workflow["put"]["security"] == [{"adminToken": []}]
    assert workflow["get"]["security"] == [{"bridgeToken": []}, {"adminToken": []}]
    used = {name for ops in paths.values() for op in ops.values()
            for alternative in op.get("security", []) for name in alternative}  # fmt: skip
    assert used == set(schemes), used
    for path, operations in paths.items():
        for operation in operations.values():
            names = [p["name"].lower() for p in operation.get("parameters", [])]
            assert "authorization" not in names, path  # the button sets the header
            if path.startswith("/api/"):
                assert operation["security"], path
    assert "security" not in paths["/healthz"]["get"]


async def test_callbacks_and_websockets_are_described(http: httpx.AsyncClient) -> None:
    schema: dict[str, Any] = (await http.get("/openapi.json")).json()
    paths = schema["paths"]
    for path in ("/callback/all", "/callback"):
        callback = paths[path]["post"]
        assert {p["name"] for p in callback["parameters"]} >= {"t", "a", "s"}
        assert "SignatureError" in callback["responses"]["403"]["description"]
        assert callback["requestBody"]["content"]["application/json"]["schema"]["required"]
    unsigned = await http.post("/callback/all", json={"event": "TASK_END"})
    assert unsigned.status_code == 403 and unsigned.json()["code"] == "SignatureError"
    for path in ("/", "/client"):
        socket = paths[path]["get"]
        assert socket["tags"] == ["websocket"] and "101" in socket["responses"], path
        assert {"token", "id"} <= {p["name"] for p in socket["parameters"]}
        assert "docs/client-protocol.md" in socket["description"]
