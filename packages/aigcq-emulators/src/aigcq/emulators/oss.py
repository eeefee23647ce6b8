"""The seed's OSS file service, for tests and demos (``aigcq emulate oss``).

* ``POST /oss/file/uploadFile`` (multipart, field ``file``) → ``{"code": 200, "data": {"url",
  "fileName"}}``; it records the ``Authorization`` / ``X-User-Info`` headers it received.
* ``GET /oss/file/{id}/{fileName}`` → the file.
* ``GET /_emulator/uploads`` → what was uploaded, with the headers.
* ``POST /_emulator/config`` ``{"failNext": N}`` → refuse the next N uploads with HTTP 500;
  ``{"mode": "down" | "garbage" | "ok", "delay": s}`` → answer every upload 503 (down), 200 with
  a body that is not JSON (garbage), or normally, after ``delay`` seconds.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response

from aigcq.emulators._http import read_json, reply, serve_app


@dataclass
class Upload:
    file_id: str
    file_name: str
    content_type: str
    data: bytes
    authorization: str
    user_info: str


@dataclass
class OssState:
    uploads: dict[str, Upload] = field(default_factory=dict)
    fail_next: int = 0
    mode: str = "ok"
    delay: float = 0.0


def parse_file_field(content_type: str, body: bytes) -> tuple[str, str, bytes] | None:
    """``(file name, content type, bytes)`` of the multipart field ``file``, if present."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            data = part.get_payload(decode=True)
            name = part.get_filename() or "file.bin"
            if isinstance(data, bytes):
                return name, part.get_content_type(), data
    return None


def create_app() -> FastAPI:
    app = FastAPI(title="OSS emulator")
    state = OssState()
    app.state.oss = state

    @app.post("/oss/file/uploadFile")
    async def upload(request: Request) -> Response:
        if state.delay:
            await asyncio.sleep(state.delay)
        if state.mode == "down":
            return reply({"code": 503, "msg": "emulated outage"}, 503)
        if state.mode == "garbage":
            return Response(b"<html>gateway", media_type="application/json")
        if state.fail_next > 0:
            state.fail_next -= 1
            return reply({"code": 500, "msg": "emulated failure"}, 500)
        parsed = parse_file_field(request.headers.get("content-type", ""), await request.body())
        if parsed is None:
            return reply({"code": 400, "msg": "multipart field 'file' is required"}, 400)
        name, content_type, data = parsed
        item = Upload(
            uuid.uuid4().hex,
            name,
            content_type,
            data,
            request.headers.get("authorization", ""),
            request.headers.get("x-user-info", ""),
        )
        state.uploads[item.file_id] = item
        url = f"{str(request.base_url).rstrip('/')}/oss/file/{item.file_id}/{name}"
        return reply({"code": 200, "msg": "success", "data": {"url": url, "fileName": name}})

    @app.get("/oss/file/{file_id}/{file_name}")
    async def download(file_id: str, file_name: str) -> Response:
        item = state.uploads.get(file_id)
        if item is None:
            return reply({"code": 404, "msg": "not found"}, 404)
        return Response(item.data, media_type=item.content_type)

    @app.get("/_emulator/uploads")
    async def uploads() -> Response:
        return reply([_describe(u) for u in state.uploads.values()])

    @app.post("/_emulator/config")
    async def configure(request: Request) -> Response:
        body = await read_json(request) or {}
        state.fail_next = int(body.get("failNext", state.fail_next))
        state.mode = str(body.get("mode", state.mode))
        state.delay = float(body.get("delay", state.delay))
        return reply({"failNext": state.fail_next, "mode": state.mode, "delay": state.delay})

    return app


def _describe(u: Upload) -> dict[str, Any]:
    return {
        "fileId": u.file_id,
        "fileName": u.file_name,
        "contentType": u.content_type,
        "size": len(u.data),
        "authorization": u.authorization,
        "userInfo": u.user_info,
    }


def run(host: str, port: int) -> None:
    asyncio.run(serve_app(create_app(), host, port))
