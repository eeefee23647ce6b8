"""The incident controls from the shell (admin token): ``aigcq pause`` / ``aigcq resume`` a
project, a paid account, a workflow or a bridge; ``aigcq tasks cancel`` and ``aigcq tasks
retry`` with filters (:func:`by_filter`; with task ids they act on those, in
:mod:`aigcq.cli.tasks`). They call the admin API (``docs/client-protocol.md``) through
:mod:`aigcq.cli.remote`; a bad option is one line and exit 2 before anything is asked, a
refusal one line and exit 1.
"""

import enum
from typing import Annotated, Any

import typer

from aigcq.cli.common import console
from aigcq.cli.remote import AdminTokenOption, InputError, ServerOption, api


class Kind(enum.StrEnum):
    project = "project"
    account = "account"
    workflow = "workflow"
    bridge = "bridge"
    hold = "hold"  # resume only: an automatic hold (budget:proj/runninghub, drift:…)


KindArgument = Annotated[
    Kind | None,
    typer.Argument(show_default=False, help="project, account, workflow or bridge"),
]
NameArgument = Annotated[
    str,
    typer.Argument(
        show_default=False,
        help="The AIGC project; a paid target (runninghub) or one project's account on it "
        "(proj/runninghub); a workflowId; a bridgeId",
    ),
]
MAX_LIMIT = 10_000  # tasks one control by filter acts on, at most


def pause(
    kind: KindArgument = None,
    name: NameArgument = "",
    note: Annotated[str, typer.Option(help="Why, shown with the pause")] = "",
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Pause a project, a paid account, a workflow or a bridge, on every server.

    Its waiting tasks hold (neither dispatched there nor failed) until `aigcq resume`;
    with no arguments, list what is paused.
    """
    if kind is None:
        _list_pauses(server, token)
        return
    _pause(server, token, "pause", kind, name, note)


def resume(
    kind: Annotated[
        Kind,
        typer.Argument(
            help="project, account, workflow or bridge; or hold: an automatic hold "
            "(budget:proj/runninghub, drift:proj/runninghub)"
        ),
    ],
    name: NameArgument,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Lift a pause: what waited is dispatched at once, on every server."""
    _pause(server, token, "resume", kind, name, "")


def _pause(server: str | None, token: str, action: str, kind: Kind, name: str, note: str) -> None:
    with api(server, token) as server_api:
        if not name:
            raise InputError(
                "missing NAME: what to pause (a project, an account, a workflow, a bridge)"
            )
        body = {"kind": kind.value, "name": name} | ({"note": note} if note else {})
        answer = server_api.post(f"/api/admin/{action}", body)
    done = "paused" if answer["paused"] else "resumed"
    what = f"{answer['kind']} {answer['name']}"
    if not answer["changed"]:
        console.print(f"{what} was {done} already", highlight=False)
    elif answer["paused"]:
        console.print(f"{what} paused on every server: its tasks wait", highlight=False)
    else:
        console.print(f"{what} resumed: its waiting tasks are dispatched", highlight=False)


def _list_pauses(server: str | None, token: str) -> None:
    import time

    with api(server, token) as server_api:
        pauses = server_api.get("/api/admin/pauses")["pauses"]
    if not pauses:
        console.print("nothing is paused", highlight=False)
    for p in pauses:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p["since"]))
        note = f"  ({p['note']})" if p["note"] else ""
        console.print(f"{p['kind']} {p['name']}  paused since {since}{note}", highlight=False)


#: what a control by filter prints for each list of its answer
DONE = {
    "cancel": {"cancelled": "cancelled"},
    "replay": {"queued": "queued again", "delivered": "given the paid result they had"},
}


def by_filter(
    action: str,
    filters: dict[str, Any],
    *,
    dry_run: bool,
    limit: int,
    as_json: bool,
    server: str | None,
    token: str,
) -> None:
    """``POST /api/admin/tasks/<action>`` (``cancel`` or ``replay``) with ``filters``
    (state, project, platform, client, target, since as epoch seconds; empty ones left
    out), and its answer printed. A bad ``limit``: :class:`InputError`, nothing asked."""
    with api(server, token) as server_api:
        if not 1 <= limit <= MAX_LIMIT:
            raise InputError(f"--limit: {limit} is not between 1 and {MAX_LIMIT}")
        body = {k: v for k, v in filters.items() if v} | {"dryRun": dry_run, "limit": limit}
        answer = server_api.post(f"/api/admin/tasks/{action}", body)
    _report(answer, as_json, done=DONE[action], verb=action)


def _report(answer: dict[str, Any], as_json: bool, *, done: dict[str, str], verb: str) -> None:
    import json

    if as_json:
        typer.echo(json.dumps(answer, ensure_ascii=False, indent=2))
        return
    if answer["dryRun"]:
        ids = ", ".join(answer["tasks"]) or "none"
        console.print(f"would {verb} {len(answer['tasks'])} task(s): {ids}", highlight=False)
    for key, said in done.items():
        if answer[key]:
            console.print(f"{said}: {', '.join(answer[key])}", highlight=False)
    for s in answer["skipped"]:
        console.print(f"not done: {s['taskId']}: {s['reason']}", highlight=False)
    if not answer["matched"]:
        console.print("no task matches", highlight=False)
    if answer["more"]:
        left = answer["matched"] - len(answer["tasks"])
        console.print(f"{left} more match: run it again (or raise --limit)", highlight=False)
