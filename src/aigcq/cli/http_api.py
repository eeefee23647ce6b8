"""The server's HTTP API as the client commands call it: one request per call through the
standard library's ``urllib`` (httpx alone cost more CPU than the rest of a command's start,
bench/cli_start_bench.py). As with any client: ``HTTP(S)_PROXY`` and ``NO_PROXY`` are
honoured and TLS certificates checked; a redirect is not followed, but reported.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

from aigcq.client.types import AigcqError

TIMEOUT_S = 30.0


class ReplyError(Exception):
    """The server answered, but not with aigcq's error envelope (a proxy, another server)."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is answered as it is: a POST is never turned into a GET


class Api:
    """The API at ``base`` with a bearer ``token``: JSON answers, aigcq's error envelope
    raised as :class:`AigcqError`, anything else as :class:`ReplyError`; a server that
    cannot be reached raises ``OSError``."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.opener = urllib.request.build_opener(_NoRedirects)

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params)

    def post(self, path: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """POST to ``path``; ``body``: a JSON object to send (else an empty body)."""
        return self._call("POST", path, params, body)

    def _call(
        self, method: str, path: str, params: dict[str, Any], body: dict[str, Any] | None = None
    ) -> Any:
        url = self.base + path + (f"?{urlencode(params)}" if params else "")
        headers, data = self.headers, b"" if method == "POST" else None
        if body is not None:
            headers = headers | {"Content-Type": "application/json"}
            data = json.dumps(body, ensure_ascii=False).encode()
        request = urllib.request.Request(url, data, headers, method=method)
        try:
            with self.opener.open(request, timeout=TIMEOUT_S) as resp:
                return _answer(path, resp.status, resp.read())
        except urllib.error.HTTPError as exc:  # any status but 2xx
            with exc:
                return _answer(path, exc.code, exc.read())
        except urllib.error.URLError as exc:  # no answer: refused, unknown host, TLS...
            reason = exc.reason
            raise reason if isinstance(reason, OSError) else OSError(str(reason)) from exc


def _answer(path: str, status: int, raw: bytes) -> Any:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if status == 200 and body is not None:
        return body
    if isinstance(body, dict) and body.get("type") == "error":
        raise AigcqError.from_reply(body)
    text = raw.decode(errors="replace")[:200]
    raise ReplyError(f"{path}: HTTP {status} {text}".rstrip())
