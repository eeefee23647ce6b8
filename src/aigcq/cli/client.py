"""Client commands: submit and status (``aigcq tasks`` and ``aigcq bridges`` are in their
own modules). How they reach the server and fail: :mod:`aigcq.cli.remote`."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from aigcq.cli.common import console, err_console
from aigcq.cli.remote import (
    AdminTokenOption,
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

    from aigcq.cli.http_api import Api


def token_subject(token: str) -> str | None:
    """A JWT's ``sub`` (signature unchecked): ``aigcq submit`` submits as the backend the token
    speaks for, so the same token may cancel the task, and AIGCQ_BIND_CLIENT_IDS lets it in.

    Read from the token's middle part here: PyJWT would load ``cryptography``, most of
    submit's start, to check nothing."""
    import base64
    import json

    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:  # not base64 (binascii.Error), not UTF-8, not JSON
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) and sub else None


def submit(
    platform: Annotated[
        str | None,
        typer.Argument(
            show_default=False,
            help="Where they run, as in config/model.json: comfyui, coze... (not with --file)",
        ),
    ] = None,
    payloads: Annotated[
        list[str] | None,
        typer.Argument(
            show_default=False, help="Payloads, JSON or @file.json: one task each (not with --file)"
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            show_default=False,
            help='Tasks as JSON lines, {"platform", "payload", "taskId"?, "AIGC"?} each '
            "(- reads stdin)",
        ),
    ] = None,
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
        typer.Option(show_default=False, help="The task's id, for one task [default: a new UUID]"),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for each result before giving up (a minute more than the "
            "server's default task deadline, so the server's own answer comes first)"
        ),
    ] = 660.0,
) -> None:
    """Submit tasks over the client WebSocket, show their progress in one display and print
    the results: one task's as JSON, several as JSON lines (refusals included), in order.

    Exit 1 unless every task succeeded.
    """
    import asyncio

    from websockets.exceptions import WebSocketException

    from aigcq.cli.submit import jobs_given, jobs_in_file, lines, submit_all
    from aigcq.client.types import AigcqError

    url = server_url(server, "ws")
    with client_errors(url, (OSError, WebSocketException)):
        token = require_token(token)
        if file is not None and (platform or payloads):
            raise InputError("give PLATFORM and PAYLOAD, or --file, not both")
        if file is None and not (platform and payloads):
            raise InputError("nothing to submit: give PLATFORM and PAYLOAD, or --file")
        jobs = (
            jobs_in_file(file, aigc=aigc or None)
            if file is not None
            else jobs_given(platform or "", payloads or [], task_id=task_id, aigc=aigc or None)
        )
        submitter = backend_id or token_subject(token) or "cli"
        run = submit_all(url, token, submitter, jobs, timeout=timeout, console=err_console)
        outcomes = asyncio.run(run)
        if len(outcomes) == 1 and isinstance(outcomes[0], AigcqError):
            raise outcomes[0]  # one line, as any refusal
    if len(outcomes) == 1:
        typer.echo(json.dumps(outcomes[0], ensure_ascii=False, indent=2))
    else:
        typer.echo("\n".join(lines(jobs, outcomes)))
    if not all(isinstance(o, dict) and o.get("status") == "success" for o in outcomes):
        raise typer.Exit(1)


def status(
    server: ServerOption = None,
    token: AdminTokenOption = "",
    limit: Annotated[int, typer.Option(help="Recent tasks listed")] = 10,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes (--watch)")] = 2.0,
) -> None:
    """Queues (waiting, in flight and capacity per target, oldest wait) and recent tasks.

    With the admin token (found as every operator verb finds it) it also shows the bridges,
    the internal capacity's health and what holds waiting work; a client token as --token
    shows the queues only.
    """
    from aigcq.cli.status import fetch_snapshot, render

    with api(server, token) as server_api:
        view = render(fetch_snapshot(server_api, limit))
        if watch:
            _watch(server_api, view, limit, interval)
            return
    console.print(view)


def _watch(server_api: "Api", view: "Group", limit: int, interval: float) -> None:
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
