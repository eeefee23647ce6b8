"""The bridge's own HTTP routes, served by :mod:`aigcq.agent.http_server`: admin page, status
API, server-address change, output files.

* ``GET /`` — small HTML page: aigcq address and connection state, instances, running
  tasks, and a form to change the address.
* ``GET /api/status`` — the same as JSON; ``GET /healthz`` — liveness.
* ``POST /api/server`` — ``{"url": "ws://host:port/ws"}`` (JSON or form). When the bridge
  has a token, the request must carry it (``Authorization: Bearer`` or a ``token`` field).
* ``GET /files/{expires}-{signature}/{taskId}/{filename}`` — the output files named in
  TASK_END ``fileUrl``s, signed as result custody's links are (:mod:`aigcq.wire.links`,
  keyed by the bridge's ``files.key``): an unsigned, forged or expired link is 403
  ``SignatureError``, so no one who reaches the bridge can list its GPU results.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import mimetypes
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

from aigcq.agent.http_server import Handler, Request, Response, byte_range, json_response
from aigcq.plumbing.http_body import BodyTooLarge
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


class _Refused(Exception):
    """Answered ``{"detail": ...}`` with ``status``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


async def _server_request(request: Request) -> tuple[str, str, bool]:
    """(url, token, is_form) from a JSON or form body (413 past its small limit)."""
    try:
        raw = (await request.body(SERVER_BODY_LIMIT)).decode("utf-8", "replace")
    except BodyTooLarge as exc:
        raise _Refused(413, str(exc)) from None
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = json.loads(raw)
        except ValueError:
            raise _Refused(400, "malformed JSON") from None
        if not isinstance(body, dict):
            raise _Refused(400, "a JSON object is required")
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


def _forbidden(detail: str) -> Response:
    return json_response({"code": ErrorCode.SIGNATURE.value, "detail": detail}, 403)


async def _inline(path: Path, filename: str, range_header: str) -> Response:
    """``path`` (whole, or the one byte range asked), shown in the browser as
    ``filename``."""
    quoted = quote(filename)
    if quoted == filename:
        disposition = f'inline; filename="{filename}"'
    else:
        disposition = f"inline; filename*=utf-8''{quoted}"
    kind = mimetypes.guess_type(filename)[0] or "text/plain"
    if kind.startswith("text/"):
        kind += "; charset=utf-8"
    size = (await asyncio.to_thread(path.stat)).st_size
    try:
        span = byte_range(range_header, size)
    except ValueError:
        return Response(416, b"", [("content-range", f"bytes */{size}")])
    headers = [("content-type", kind), ("content-disposition", disposition)]
    headers.append(("accept-ranges", "bytes"))
    if span is None:
        return Response(200, path, headers)
    headers.append(("content-range", f"bytes {span[0]}-{span[1]}/{size}"))
    return Response(206, path, headers, span)


def bridge_routes(bridge: BridgeControl) -> Handler:
    """The handler of the bridge's routes (see the module)."""
    return _Routes(bridge).handle


class _Routes:
    def __init__(self, bridge: BridgeControl) -> None:
        self.bridge = bridge

    async def handle(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except _Refused as exc:
            return json_response({"detail": exc.detail}, exc.status)

    async def _route(self, request: Request) -> Response:
        segments = request.path.split("/")[1:]
        match request.method, segments:
            case "GET", [""]:
                page = _page(self.bridge.status()).encode()
                return Response(200, page, [("content-type", "text/html; charset=utf-8")])
            case "GET", ["api", "status"]:
                return json_response(self.bridge.status())
            case "GET", ["healthz"]:  # liveness, as every aigcq process answers
                return json_response({"status": "ok"})
            case "POST", ["api", "server"]:
                return await self._set_server(request)
            case "GET", ["files", task_id, filename] if task_id and filename:
                return _forbidden("unsigned link: fetch the fileUrl its TASK_END carried, as given")
            case "GET", ["files", token, task_id, filename] if token and task_id and filename:
                return await self._signed_file(token, task_id, filename, request)
        return _unrouted(segments)

    async def _set_server(self, request: Request) -> Response:
        token_of_bridge = self.bridge.token
        if _bearer(request) and not _authorized(request, "", token_of_bridge):
            raise _Refused(401, TOKEN_REQUIRED)  # before reading the body
        url, token, is_form = await _server_request(request)
        if not _authorized(request, token, token_of_bridge):
            raise _Refused(401, TOKEN_REQUIRED)
        if urlsplit(url).scheme not in ("ws", "wss") or not urlsplit(url).netloc:
            raise _Refused(400, "url must be ws://host:port/path or wss://…")
        await self.bridge.set_server(url)
        if is_form:
            return Response(303, b"", [("location", "/")])
        return json_response({"server": url})

    async def _signed_file(
        self, token: str, task_id: str, filename: str, request: Request
    ) -> Response:
        why = refusal(self.bridge.file_key, token, f"{task_id}/{filename}", time.time())
        if why is not None:
            return _forbidden(f"{why} link: only a TASK_END's fileUrl, within its expiry")
        root = self.bridge.files_dir.resolve()
        path = (root / quote(task_id, safe="") / filename).resolve()
        if path.parent.parent != root or not path.is_file():  # only files it produced
            raise _Refused(404, "no such file")
        return await _inline(path, filename, request.headers.get("range", ""))


def _unrouted(segments: list[str]) -> Response:
    """405 on a route's path with another method, else 404 (as Starlette's router)."""
    match segments:
        case [""] | ["api", "status"] | ["healthz"]:
            allow = "GET"
        case ["files", *rest] if len(rest) in (2, 3) and all(rest):
            allow = "GET"
        case ["api", "server"]:
            allow = "POST"
        case _:
            return json_response({"detail": "Not Found"}, 404)
    return json_response({"detail": "Method Not Allowed"}, 405, ("allow", allow))
