"""The client commands' HTTP calls (``aigcq.cli.http_api``) against a plain HTTP server:
JSON answers, aigcq's error envelope as ``AigcqError``, anything else as one readable
``ReplyError``, and a redirect reported, never followed (a POST must not become a GET)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from aigcq.cli.http_api import Api, ReplyError
from aigcq.client.types import AigcqError
from tests.fakes.servers import closed_port

ENVELOPE = {
    "type": "error",
    "code": "TaskNotFound",
    "msg": "任务不存在。",
    "detail": "no such task",
}


class Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, str]]] = []  # (method, path, Authorization)

    def reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
        Handler.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if status == 302:
            self.send_header("Location", "/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self) -> None:
        routes = {
            "/json": (200, json.dumps({"a": 1}).encode()),
            "/refused": (404, json.dumps(ENVELOPE, ensure_ascii=False).encode()),
            "/proxy": (502, b"<html>Bad Gateway</html>"),
            "/moved": (302, b""),
        }
        status, body = routes.get(self.path.split("?")[0], (404, b"{}"))
        self.reply(status, body)

    do_GET = do_POST = answer

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Handler.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_json_answer_with_the_token_and_the_query(base: str) -> None:
    api = Api(base, "tok")
    assert api.get("/json", state="failed", since=1.5) == {"a": 1}
    assert api.post("/json") == {"a": 1}
    assert Handler.seen == [
        ("GET", "/json?state=failed&since=1.5", "Bearer tok"),
        ("POST", "/json", "Bearer tok"),
    ]


def test_aigcqs_error_envelope_is_an_aigcq_error(base: str) -> None:
    with pytest.raises(AigcqError) as refused:
        Api(base, "tok").post("/refused")
    assert (refused.value.code, refused.value.detail) == ("TaskNotFound", "no such task")


def test_another_servers_answer_is_one_readable_line(base: str) -> None:
    with pytest.raises(ReplyError, match=r"^/proxy: HTTP 502 <html>Bad Gateway</html>$"):
        Api(base, "tok").get("/proxy")


def test_a_redirect_is_reported_not_followed(base: str) -> None:
    with pytest.raises(ReplyError, match=r"^/moved: HTTP 302$"):
        Api(base, "tok").post("/moved")
    assert [method for method, _, _ in Handler.seen] == ["POST"]  # no GET /json after it


def test_no_server_is_an_os_error() -> None:
    with closed_port() as port, pytest.raises(ConnectionRefusedError):
        Api(f"http://127.0.0.1:{port}", "tok").get("/json")
