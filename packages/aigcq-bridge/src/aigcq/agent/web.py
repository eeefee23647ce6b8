"""The bridge's own HTTP server: admin page, status API, server-address change, output files.

* ``GET /`` — small HTML page: aigcq address and connection state, instances, running
  tasks, and a form to change the address.
* ``GET /api/status`` — the same as JSON.
* ``POST /api/server`` — ``{"url": "ws://host:port/ws"}`` (JSON or form). When the bridge
  has a token, the request must carry it (``Authorization: Bearer`` or a ``token`` field).
* ``GET /files/{expires}-{signature}/{taskId}/{filename}`` — the output files named in
  TASK_END ``fileUrl``s, signed as result custody's links are (:mod:`aigcq.wire.links`,
  keyed by the bridge's ``files.key``): an unsigned, forged or expired link is 403
  ``SignatureError``, so no one who reaches the bridge can list its GPU results.
"""

from __future__ import annotations

import hmac
import html
import json
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response

from aigcq.plumbing.http_body import BodyTooLarge, Disconnected, request_body
from aigcq.wire.errors import ErrorCode
from aigcq.wire.links import refusal

#: the route of result files
FILES = "/files"


class BridgeControl(Protocol):
    token: str
    files_dir: Path
    file_key: bytes

    def status(self) -> dict[str, Any]: ...

    async def set_server(self, url: str) -> None: ...


def _page(status: dict[str, Any]) -> str:
    conn = status["connection"]
    rows = "".join(
        f"<tr><td>{html.escape(i['instanceId'])}</td><td>{html.escape(i['url'])}</td>"
        f"<td>{i['state']}</td><td>{html.escape(i.get('taskId') or '')}</td></tr>"
        for i in status["instances"]
    )
    tasks = "".join(
        f"<tr><td>{html.escape(t['taskId'])}</td><td>{html.escape(t['instanceId'])}</td>"
        f"<td>{html.escape(json.dumps(t['progress']))}</td><td>{t['seconds']}</td></tr>"
        for t in status["tasks"]
    )
    server = html.escape(status["server"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>aigcq bridge</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left}}</style>
</head><body><h1>aigcq bridge {html.escape(status["bridgeId"])}</h1>
<p>Server <code>{server}</code>: <b>{conn["state"]}</b> {html.escape(conn["lastError"])}</p>
<form method="post" action="/api/server">
<input name="url" size="50" value="{server}"> <input name="token" type="password"
placeholder="bridge token"> <button>Change server</button></form>
<h2>Instances</h2><table><tr><th>id</th><th>url</th><th>state</th><th>task</th></tr>{rows}
</table><h2>Running tasks</h2><table><tr><th>task</th><th>instance</th><th>progress</th>
<th>seconds</th></tr>{tasks}</table>
<p>Undelivered results: {len(status["spooled"])}</p></body></html>"""


#: ``{"url": ..., "token": ...}`` (JSON or form): a small body
SERVER_BODY_LIMIT = 16 << 10
#: the admin page's refusal names what to send (issue 30 item 5)
TOKEN_REQUIRED = (
    "bridge token required: this bridge's token (AIGCQ_BRIDGE_TOKEN, --token or --token-file "
    "of `aigcq bridge`) as Authorization: Bearer or the form's token field"
)


async def _server_request(request: Request) -> tuple[str, str, bool]:
    """(url, token, is_form) from a JSON or form body (413 past its small limit)."""
    try:
        raw = (await request_body(request, SERVER_BODY_LIMIT)).decode("utf-8", "replace")
    except BodyTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except Disconnected:
        raise HTTPException(400, "the request body did not arrive") from None
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = json.loads(raw)
        except ValueError:
            raise HTTPException(400, "malformed JSON") from None
        if not isinstance(body, dict):
            raise HTTPException(400, "a JSON object is required")
        return str(body.get("url", "")), str(body.get("token", "")), False
    form = dict(parse_qsl(raw))
    return form.get("url", ""), form.get("token", ""), True


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None


def _authorized(request: Request, given: str, expected: str) -> bool:
    """The bearer token, else ``given`` (the form's field), is the bridge's token."""
    if not expected:
        return True
    candidate = _bearer(request)
    return hmac.compare_digest(
        (given if candidate is None else candidate).encode(), expected.encode()
    )


def _forbidden(detail: str) -> JSONResponse:
    return JSONResponse({"code": ErrorCode.SIGNATURE.value, "detail": detail}, 403)


def create_web_app(bridge: BridgeControl) -> FastAPI:
    app = FastAPI(title="aigcq bridge")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return _page(bridge.status())

    @app.get("/api/status")
    async def status() -> dict[str, Any]:
        return bridge.status()

    @app.get("/healthz")  # liveness, as every aigcq process answers
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/server")
    async def set_server(request: Request) -> Response:
        if _bearer(request) and not _authorized(request, "", bridge.token):
            raise HTTPException(401, TOKEN_REQUIRED)  # before reading the body
        url, token, is_form = await _server_request(request)
        if not _authorized(request, token, bridge.token):
            raise HTTPException(401, TOKEN_REQUIRED)
        if urlsplit(url).scheme not in ("ws", "wss") or not urlsplit(url).netloc:
            raise HTTPException(400, "url must be ws://host:port/path or wss://…")
        await bridge.set_server(url)
        if is_form:
            return RedirectResponse("/", status_code=303)
        return JSONResponse({"server": url})

    _file_routes(app, bridge)
    return app


def _file_routes(app: FastAPI, bridge: BridgeControl) -> None:
    """Result files, behind their signed links only."""

    @app.get(FILES + "/{task_id}/{filename}")
    async def unsigned_file(task_id: str, filename: str) -> Response:
        return _forbidden("unsigned link: fetch the fileUrl its TASK_END carried, as given")

    @app.get(FILES + "/{token}/{task_id}/{filename}")
    async def files(token: str, task_id: str, filename: str) -> Response:
        why = refusal(bridge.file_key, token, f"{task_id}/{filename}", time.time())
        if why is not None:
            return _forbidden(f"{why} link: only a TASK_END's fileUrl, within its expiry")
        root = bridge.files_dir.resolve()
        path = (root / quote(task_id, safe="") / filename).resolve()
        if path.parent.parent != root or not path.is_file():  # only files it produced
            raise HTTPException(404, "no such file")
        return FileResponse(path, filename=filename, content_disposition_type="inline")
