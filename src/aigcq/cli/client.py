"""Client commands: submit and status (``aigcq tasks`` and ``aigcq bridges`` are in their
own modules). How they reach the server and fail: :mod:`aigcq.cli.remote`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aigcq.cli.common import console
from aigcq.cli.remote import (
    InputError,
    ServerOption,
    TokenOption,
    api,
    client_errors,
    require_token,
    server_url,
)

if TYPE_CHECKING:
    from rich.console import Group

    from aigcq.cli.remote import Api


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

    from websockets.exceptions import WebSocketException

    from aigcq.cli.submit import submit_and_wait

    url = server_url(server, "ws")
    with client_errors(url, (OSError, WebSocketException)):
        token = require_token(token)
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

    with api(server, token) as server_api:
        view = render(fetch_snapshot(server_api, limit))
        if watch:
            _watch(server_api, view, limit, interval)
            return
    console.print(view)


def _watch(server_api: Api, view: Group, limit: int, interval: float) -> None:
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
                view = render(fetch_snapshot(server_api, limit))
        with Live(view, console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(fetch_snapshot(server_api, limit)))
    except KeyboardInterrupt:
        return
