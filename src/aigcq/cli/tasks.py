"""``aigcq tasks``: show one task, list tasks by filter, cancel and retry tasks.

Each finds the admin token as every operator verb does
(:func:`aigcq.cli.remote.operator_token`); ``show`` and ``cancel`` also take a client token
as ``--token`` (its own tasks). A task the server refuses (unknown, already finished, not
retryable) is one line naming it and the refusal's code; the others are still done, and
the exit code is 1.
"""

import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from aigcq.cli.common import console, error_line
from aigcq.cli.remote import AdminTokenOption, InputError, ServerOption, api, refusal

if TYPE_CHECKING:
    from aigcq.cli.http_api import Api

tasks_app = typer.Typer(no_args_is_help=True, help="Show, list, cancel and retry tasks.")

#: refusals about one task: the next task is still tried
PER_TASK = {"TaskNotFound", "TaskGone", "TaskNotRetryable"}
MAX_PAGE = 1000
TaskIds = Annotated[
    list[str] | None,
    typer.Argument(show_default=False, help="Task ids, as given at submit (or filters instead)"),
]
ProjectOption = Annotated[
    str, typer.Option("--project", "--aigc", help="AIGC project [default: any]")
]
PlatformOption = Annotated[str, typer.Option(help="Platform: comfyui, coze... [default: any]")]
ClientOption = Annotated[str, typer.Option(help="The client's backendId [default: any]")]
TargetOption = Annotated[
    str, typer.Option(help="Where it runs or ran: bridge, runninghub... [default: any]")
]
SinceOption = Annotated[
    str,
    typer.Option(
        help="Changed since: 30s, 10m, 2h, 1d ago, or a local time: 14:05, "
        "2026-01-31T14:05 [default: any time]"
    ),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="With filters: say which tasks; change nothing")
]
LimitOption = Annotated[
    int | None,
    typer.Option(show_default=False, help="With filters: act on this many at most (1-10000) "
                 "[default: 1000]"),
]  # fmt: skip
JsonOption = Annotated[
    bool, typer.Option("--json", help="With filters: print the server's answer as JSON")
]


def task_path(task_id: str, action: str = "") -> str:
    """``/api/tasks/<id>[/<action>]``, the id quoted (it may hold ``/`` or ``?``)."""
    return f"/api/tasks/{quote(task_id, safe='')}" + (f"/{action}" if action else "")


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="The id given at submit")],
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Print a task's timeline (every transition with its time, target and attempt) and,
    for a failed task, why: the failure's class, code and message."""
    from aigcq.cli.status import timeline

    with api(server, token) as server_api:
        view = timeline(server_api, task_id)
    console.print(view)


@tasks_app.command("list")
def tasks_list(
    state: Annotated[
        str,
        typer.Option(
            help="States, comma-separated: pending, dispatching, running, success, failed, "
            "cancelled; live (the first three), finished (the last three) [default: any]"
        ),
    ] = "",
    project: ProjectOption = "",
    platform: PlatformOption = "",
    client: ClientOption = "",
    target: TargetOption = "",
    since: SinceOption = "",
    limit: Annotated[int, typer.Option(help=f"Tasks per page, 1-{MAX_PAGE}")] = 50,
    page: Annotated[int, typer.Option(help="Page, from 1")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON")] = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """List tasks, waiting, running and recently finished ones, the latest to change first:
    where each runs (or ran), since when, for how long, and why it failed.

    Finished tasks are those the server still keeps among the last 1000 to finish.
    """
    import json
    import time

    from aigcq.cli.status import task_list

    now = time.time()
    with api(server, token) as server_api:
        params = list_params(state, since, limit, page, now)
        filters = {"aigc": project, "platform": platform, "client": client, "target": target}
        answer = server_api.get("/api/admin/tasks", **params, **filters)
    if as_json:
        typer.echo(json.dumps(answer, ensure_ascii=False, indent=2))
        return
    console.print(task_list(answer, now))
    if answer["offset"] + len(answer["tasks"]) < answer["total"]:
        console.print(f"more: --page {page + 1}", highlight=False)


def list_params(state: str, since: str, limit: int, page: int, now: float) -> dict[str, Any]:
    """The list's query, checked here (:class:`InputError` naming the option)."""
    from aigcq.domain import states_named

    try:
        states_named(state)
    except ValueError as exc:
        raise InputError(f"--state: {exc}") from exc
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"--limit: {limit} is not between 1 and {MAX_PAGE}")
    if page < 1:
        raise InputError(f"--page: {page} is not 1 or more")
    return {
        "state": state,
        "since": since_time(since, now) if since else 0,
        "limit": limit,
        "offset": (page - 1) * limit,
    }


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_CLOCKS = ("%H:%M", "%H:%M:%S")


def since_time(given: str, now: float) -> float:
    """``given`` as epoch seconds: ``10m`` (ago; s, m, h, d), ``14:05`` (its last time, local)
    or an ISO date and time (local unless it names its zone); :class:`InputError` if none."""
    if match := re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", given.strip()):
        return now - float(match[1]) * _UNITS[match[2]]
    for form in _CLOCKS:
        try:
            clock = datetime.strptime(given, form).time()
        except ValueError:
            continue
        at = datetime.combine(datetime.fromtimestamp(now).date(), clock).timestamp()
        return at if at <= now else at - _UNITS["d"]  # a time still to come today: yesterday
    try:
        return datetime.fromisoformat(given).timestamp()
    except ValueError:
        pass
    raise InputError(
        f"--since: {given!r} is no time (30s, 10m, 2h, 1d ago; 14:05; 2026-01-31T14:05)"
    )


@tasks_app.command("cancel")
def tasks_cancel(
    task_ids: TaskIds = None,
    state: Annotated[
        str,
        typer.Option(
            help="With filters: pending, dispatching, running, comma-separated [default: all]"
        ),
    ] = "",
    project: ProjectOption = "",
    platform: PlatformOption = "",
    client: ClientOption = "",
    target: TargetOption = "",
    since: SinceOption = "",
    dry_run: DryRunOption = False,
    limit: LimitOption = None,
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Cancel live tasks: those named (a client token: its own; the admin token: any), or
    the waiting and running ones filters name (the admin token).

    A paid platform's task is cancelled there too.
    """
    filters = {"state": state, "project": project, "platform": platform, "client": client,
               "target": target, "since": since}  # fmt: skip
    if not task_ids:
        _by_filter("cancel", filters, dry_run, limit, as_json, server, token)
        return
    with api(server, token) as server_api:
        _only_ids(filters, dry_run, limit, as_json, FLAGS)
        ok = each_task(server_api, task_ids, lambda t: task_path(t, "cancel"), said("cancelled"))
    if not ok:
        raise typer.Exit(1)


@tasks_app.command("retry")
def tasks_retry(
    task_ids: TaskIds = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="With filters: failed tasks (the default)")
    ] = False,
    cancelled: Annotated[
        bool, typer.Option("--cancelled", help="With filters: cancelled tasks")
    ] = False,
    project: ProjectOption = "",
    platform: PlatformOption = "",
    client: ClientOption = "",
    target: TargetOption = "",
    since: SinceOption = "",
    dry_run: DryRunOption = False,
    limit: LimitOption = None,
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Queue failed or cancelled tasks again, each as a new attempt (its client gets that
    result too): those named, or those filters name (`--failed` alone: every failed one).
    Admin token.

    Never paid twice: a task whose paid run brought a result after it ended gets that
    result; one whose paid run may still be out is left as it is (said, with why).
    """
    states = [s for s, given in (("failed", failed), ("cancelled", cancelled)) if given]
    filters = {"state": ",".join(states), "project": project, "platform": platform,
               "client": client, "target": target, "since": since}  # fmt: skip
    if not task_ids:
        _by_filter("replay", filters, dry_run, limit, as_json, server, token)
        return

    def path(task_id: str) -> str:
        return f"/api/admin/tasks/{quote(task_id, safe='')}/retry"

    with api(server, token) as server_api:
        _only_ids(filters, dry_run, limit, as_json, RETRY_FLAGS)
        ok = each_task(server_api, task_ids, path, said("queued again, as a new attempt"))
    if not ok:
        raise typer.Exit(1)


#: how each filter is given, on the command line
FLAGS = {"state": "--state", "project": "--project", "platform": "--platform",
         "client": "--client", "target": "--target", "since": "--since"}  # fmt: skip
RETRY_FLAGS = FLAGS | {"state": "--failed, --cancelled"}


def _by_filter(
    action: str,
    filters: dict[str, str],
    dry_run: bool,
    limit: int | None,
    as_json: bool,
    server: str | None,
    token: str,
) -> None:
    """A cancel or replay by filter (:func:`aigcq.cli.controls.by_filter`), or the error
    that neither task ids nor a filter were given (exit 2, nothing asked)."""
    import time

    from aigcq.cli.common import fail
    from aigcq.cli.controls import by_filter

    if not any(filters.values()):
        flags = ", ".join((RETRY_FLAGS if action == "replay" else FLAGS).values())
        fail(f"name task ids, or filters: at least one of {flags}", 2)
    body: dict[str, Any] = dict(filters)
    if action == "replay" and not body["state"]:
        body["state"] = "failed"
    if filters["since"]:
        try:
            body["since"] = since_time(filters["since"], time.time())
        except InputError as exc:
            fail(str(exc), 2, exc)
    by_filter(
        action,
        body,
        dry_run=dry_run,
        limit=1000 if limit is None else limit,
        as_json=as_json,
        server=server,
        token=token,
    )


def _only_ids(
    filters: dict[str, str], dry_run: bool, limit: int | None, as_json: bool, flags: dict[str, str]
) -> None:
    """Task ids take no filter nor a filter's options (:class:`InputError` naming them)."""
    given = [flags[k] for k, v in filters.items() if v]
    given += [flag for flag, on in (("--dry-run", dry_run), ("--limit", limit is not None),
                                    ("--json", as_json)) if on]  # fmt: skip
    if given:
        raise InputError(f"task ids or filters, not both: {', '.join(given)} goes with filters")


def said(done: str) -> Callable[[dict[str, Any]], str]:
    """The line for a task the server acted on: ``t1: cancelled``."""
    return lambda answer: f"{answer['taskId']}: {done}"


def each_task(
    server: "Api", task_ids: list[str], path: Callable[[str], str], line: Callable[..., str]
) -> bool:
    """POST ``path(id)`` for each task, printing its ``line``; a refusal about one task is
    a line on stderr and the next is tried (any other refusal stops them). True: all done."""
    from aigcq.client.types import AigcqError

    ok = True
    for task_id in task_ids:
        try:
            answer = server.post(path(task_id))
        except AigcqError as exc:
            if exc.code not in PER_TASK:
                raise
            error_line(f"{task_id}: {refusal(exc)}")
            ok = False
            continue
        console.print(line(answer), highlight=False)
    return ok
