"""Client commands: submit, status, tasks show.

They talk to a running server; what can be expected to go wrong (no token, bad input, the
server down or refusing) is one line on stderr and exit 1 (the server) or 2 (the input).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aigcq.cli.common import console, fail, load_settings, local_host

if TYPE_CHECKING:
    import httpx
    from rich.console import Group

    from aigcq.client import AigcqError

TOKEN_ENV = "AIGCQ_CLIENT_TOKEN"
ServerOption = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="aigcq's address (default: where `aigcq up` listens: AIGCQ_HOST, AIGCQ_WS_PORT)",
    ),
]
TokenOption = Annotated[
    str,
    typer.Option(envvar=TOKEN_ENV, show_default=False, help="Client token (`aigcq token ID`)"),
]


class InputError(Exception):
    """A bad argument, token or input file (exit code 2)."""


@contextlib.contextmanager
def client_errors(server: str) -> Iterator[None]:
    """Report the failures a client command can expect as one line and an exit code."""
    import httpx
    from websockets.exceptions import WebSocketException

    from aigcq.cli.status import StatusError
    from aigcq.client import AigcqError

    try:
        yield
    except InputError as exc:
        fail(str(exc), 2, exc)
    except AigcqError as exc:
        fail(_refusal(exc), 1, exc)
    except StatusError as exc:
        fail(str(exc), 1, exc)
    except (OSError, httpx.TransportError, WebSocketException) as exc:
        reason = str(exc) or type(exc).__name__
        fail(f"cannot reach the aigcq server at {server}: {reason}", 1, exc)


def _refusal(exc: AigcqError) -> str:
    """``AuthError: <the server's message> (<detail>)``."""
    detail = f" ({exc.detail})" if exc.detail else ""
    return f"{exc.code}: {exc.msg or 'refused by the server'}{detail}"


_SECURE = {"http": "", "ws": "", "https": "s", "wss": "s"}


def server_url(server: str | None, scheme: str) -> str:
    """Where a client command connects, with its scheme (``ws`` or ``http``): ``server``
    (``http://`` and ``ws://`` both work) or, by default, where ``aigcq up`` with the same
    settings (``AIGCQ_HOST``, ``AIGCQ_WS_PORT``, environment or ``.env``) listens."""
    if server is None:
        settings = load_settings()
        return f"{scheme}://{local_host(settings.host)}:{settings.ws_port}/"
    given, sep, rest = server.partition("://")
    if not sep:
        return f"{scheme}://{server}"
    secure = _SECURE.get(given.lower())
    return server if secure is None else f"{scheme}{secure}://{rest}"


def _require_token(token: str) -> str:
    if not token:
        raise InputError(f"no token: pass --token or set {TOKEN_ENV} (`aigcq token ID` prints one)")
    return token


def token_subject(token: str) -> str | None:
    """A JWT's ``sub`` (signature unchecked): ``aigcq submit`` submits as the backend the token
    speaks for, so the same token may cancel the task, and AIGCQ_BIND_CLIENT_IDS lets it in."""
    import jwt

    try:
        sub = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.PyJWTError:
        return None
    return sub if isinstance(sub, str) and sub else None


def _read_payload(payload: str) -> dict[str, Any]:
    """``payload`` (JSON, or ``@file.json``) as a JSON object; :class:`InputError` if not."""
    import json

    if payload.startswith("@"):
        try:
            payload = Path(payload[1:]).read_text()
        except OSError as exc:
            raise InputError(f"cannot read payload file {payload[1:]}: {exc.strerror}") from exc
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise InputError(f"payload is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InputError(f"payload must be a JSON object, not {type(body).__name__}")
    return body


def submit(
    platform: Annotated[
        str, typer.Argument(help="Where it runs, as in config/model.json: comfyui, coze...")
    ],
    payload: Annotated[str, typer.Argument(help="JSON, or @file.json")],
    server: ServerOption = None,
    token: TokenOption = "",
    backend_id: Annotated[
        str | None,
        typer.Option(show_default=False, help="Submit as (default: the token's JWT sub, else cli)"),
    ] = None,
    aigc: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="AIGC project (config/model.json key) [default: AIGCQ_PROJECT_PREFIX, aigcq]",
        ),
    ] = None,
    task_id: Annotated[
        str | None,
        typer.Option(show_default=False, help="The task's id [default: a new UUID]"),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for the result before giving up (a minute more than the "
            "server's default task deadline, so the server's own answer comes first)"
        ),
    ] = 660.0,
) -> None:
    """Submit one task over the client WebSocket, show progress and print the result."""
    import asyncio
    import json

    from aigcq.cli.submit import submit_and_wait

    url = server_url(server, "ws")
    with client_errors(url):
        token = _require_token(token)
        result = asyncio.run(
            submit_and_wait(
                url,
                token,
                backend_id or token_subject(token) or "cli",
                platform,
                _read_payload(payload),
                task_id=task_id,
                aigc=aigc or None,
                timeout=timeout,
                console=console,
            )
        )
    typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
    if result.get("status") != "success":
        raise typer.Exit(1)


@contextlib.contextmanager
def _http(server: str | None, token: str) -> Iterator[httpx.Client]:
    """An HTTP client for the server's API, inside :func:`client_errors`."""
    import httpx

    url = server_url(server, "http")
    with client_errors(url):
        headers = {"Authorization": f"Bearer {_require_token(token)}"}
        with httpx.Client(base_url=url, headers=headers) as http:
            yield http


def status(
    server: ServerOption = None,
    token: TokenOption = "",
    limit: Annotated[int, typer.Option(help="Recent tasks listed")] = 10,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes (--watch)")] = 2.0,
) -> None:
    """Queues (waiting, in flight and capacity per target, oldest wait) and recent tasks.

    With the admin token (AIGCQ_ADMIN_TOKEN, in .aigcq/secrets.json) as --token it also
    shows the bridges and the internal capacity's health.
    """
    from aigcq.cli.status import fetch_snapshot, render

    with _http(server, token) as http:
        view = render(fetch_snapshot(http, limit))
        if watch:
            _watch(http, view, limit, interval)
            return
    console.print(view)


def _watch(http: httpx.Client, view: Group, limit: int, interval: float) -> None:
    """Redraw the status tables every ``interval`` seconds until Ctrl-C; when the output is
    not a terminal (piped, redirected), append each round, under its time, instead."""
    import time

    from rich.live import Live

    from aigcq.cli.status import fetch_snapshot, render

    try:
        if not console.is_terminal:
            while True:
                console.print(f"--- {time.strftime('%H:%M:%S')}", highlight=False)
                console.print(view)
                console.file.flush()
                time.sleep(interval)
                view = render(fetch_snapshot(http, limit))
        with Live(view, console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(fetch_snapshot(http, limit)))
    except KeyboardInterrupt:
        return


tasks_app = typer.Typer(no_args_is_help=True, help="Inspect tasks.")


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="The id given at submit")],
    server: ServerOption = None,
    token: TokenOption = "",
) -> None:
    """Print a task's timeline (every transition with its time, target and attempt) and,
    for a failed task, why: the failure's class, code and message."""
    from aigcq.cli.status import timeline

    with _http(server, token) as http:
        view = timeline(http, task_id)
    console.print(view)
