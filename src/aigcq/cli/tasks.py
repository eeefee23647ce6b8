"""``aigcq tasks``: show one task."""

from __future__ import annotations

from typing import Annotated

import typer

from aigcq.cli.common import console
from aigcq.cli.remote import ServerOption, TokenOption, api

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

    with api(server, token) as server_api:
        view = timeline(server_api, task_id)
    console.print(view)
