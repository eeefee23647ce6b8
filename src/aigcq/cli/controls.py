"""The incident controls from the shell (admin token): ``aigcq pause`` / ``aigcq resume`` a
project, a paid account, a workflow or a bridge; ``aigcq tasks cancel`` and ``aigcq tasks
retry --failed`` with filters. They call the admin API (``docs/client-protocol.md``); a bad
option is one line and exit 2 before anything is asked, a refusal one line and exit 1.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer

from aigcq.cli.client import InputError, ServerOption, client_errors, server_url
from aigcq.cli.common import console

AdminTokenOption = Annotated[
    str,
    typer.Option(
        envvar=["AIGCQ_ADMIN_TOKEN", "AIGCQ_CLIENT_TOKEN"],
        show_default=False,
        help="The admin token (AIGCQ_ADMIN_TOKEN, in .aigcq/secrets.json)",
    ),
]


class Kind(enum.StrEnum):
    project = "project"
    account = "account"
    workflow = "workflow"
    bridge = "bridge"


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
    kind: Annotated[Kind, typer.Argument(help="project, account, workflow or bridge")],
    name: NameArgument,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Lift a pause: what waited is dispatched at once, on every server."""
    _pause(server, token, "resume", kind, name, "")


def _pause(server: str | None, token: str, action: str, kind: Kind, name: str, note: str) -> None:
    if not name:
        _fail_input("missing NAME: what to pause (a project, an account, a workflow, a bridge)")
    body = {"kind": kind.value, "name": name} | ({"note": note} if note else {})
    answer = admin_post(server, token, f"/api/admin/{action}", body)
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

    pauses = admin_request(server, token, "GET", "/api/admin/pauses")["pauses"]
    if not pauses:
        console.print("nothing is paused", highlight=False)
    for p in pauses:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p["since"]))
        note = f"  ({p['note']})" if p["note"] else ""
        console.print(f"{p['kind']} {p['name']}  paused since {since}{note}", highlight=False)


SinceOption = Annotated[
    str,
    typer.Option(
        help="Changed since: 30s, 10m, 2h, 1d ago, or a local time: 14:05, 2026-01-31T14:05 "
        "[default: any time]"
    ),
]
ProjectOption = Annotated[str, typer.Option("--project", "--aigc", help="AIGC project")]
PlatformOption = Annotated[str, typer.Option(help="Platform: comfyui, coze...")]
ClientOption = Annotated[str, typer.Option(help="The client's backendId")]
TargetOption = Annotated[str, typer.Option(help="Where it runs or ran: bridge, runninghub...")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Say which tasks; change nothing")]
LimitOption = Annotated[int, typer.Option(help="Act on this many at most (1-10000)")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the server's answer as JSON")]


def tasks_cancel(
    state: Annotated[
        str, typer.Option(help="pending, dispatching, running, comma-separated [default: all]")
    ] = "",
    project: ProjectOption = "",
    platform: PlatformOption = "",
    client: ClientOption = "",
    target: TargetOption = "",
    since: SinceOption = "",
    dry_run: DryRunOption = False,
    limit: LimitOption = 1000,
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Cancel the waiting and running tasks a filter names.

    Name at least one filter. A running paid task is cancelled on its platform too.
    """
    filters = _filters(state, project, platform, client, target, since, dry_run, limit)
    answer = admin_post(server, token, "/api/admin/tasks/cancel", filters)
    _report(answer, as_json, done={"cancelled": "cancelled"}, verb="cancel")


def tasks_retry(
    failed: Annotated[bool, typer.Option("--failed", help="Failed tasks (the default)")] = False,
    cancelled: Annotated[bool, typer.Option("--cancelled", help="Cancelled tasks")] = False,
    project: ProjectOption = "",
    platform: PlatformOption = "",
    client: ClientOption = "",
    target: TargetOption = "",
    since: SinceOption = "",
    dry_run: DryRunOption = False,
    limit: LimitOption = 1000,
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Replay the failed (or cancelled) tasks a filter names, each as a new attempt.

    Never paid twice: a task whose paid run brought a result after it ended gets that
    result; one whose paid run may still be out is left as it is (listed, with why).
    """
    states = [s for s, given in (("failed", failed), ("cancelled", cancelled)) if given]
    state = ",".join(states or ["failed"])
    filters = _filters(state, project, platform, client, target, since, dry_run, limit)
    answer = admin_post(server, token, "/api/admin/tasks/replay", filters)
    done = {"queued": "queued again", "delivered": "given the paid result they had"}
    _report(answer, as_json, done=done, verb="replay")


def _filters(
    state: str,
    project: str,
    platform: str,
    client: str,
    target: str,
    since: str,
    dry_run: bool,
    limit: int,
) -> dict[str, Any]:
    """The body of a control by filter, checked here (exit 2 naming the option)."""
    import time

    named = {"project": project, "platform": platform, "client": client, "target": target}
    if not (since or any(named.values()) or state):
        _fail_input("name at least one of --project, --platform, --client, --target, --since")
    if not 1 <= limit <= 10_000:
        _fail_input(f"--limit: {limit} is not between 1 and 10000")
    body: dict[str, Any] = {k: v for k, v in named.items() if v}
    if state:
        body["state"] = state
    if since:
        try:
            body["since"] = since_time(since, time.time())
        except ValueError as exc:
            _fail_input(f"--since: {exc}")
    return body | {"dryRun": dry_run, "limit": limit}


_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(text: str, now: float) -> float:
    """``10m`` (ago), ``14:05`` (today, local time) or an ISO time, as epoch seconds."""
    text = text.strip()
    if m := _AGO.fullmatch(text):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text):
            today = datetime.fromtimestamp(now).date().isoformat()
            return datetime.fromisoformat(f"{today}T{text}").timestamp()
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    raise ValueError(f"{text!r} is no time: say 30s, 10m, 2h, 1d, 14:05 or 2026-01-31T14:05")


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


def admin_post(server: str | None, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return admin_request(server, token, "POST", path, body)


def admin_request(
    server: str | None, token: str, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The admin API's answer, inside :func:`client_errors` (one line and an exit code)."""
    import httpx

    from aigcq.cli.status import _refusal

    url = server_url(server, "http")
    with client_errors(url):
        if not token:
            raise InputError("no admin token: pass --token or set AIGCQ_ADMIN_TOKEN")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers) as http:
            resp = http.request(method, path, json=body)
        if resp.status_code != 200:
            raise _refusal(path, resp)
        answer: dict[str, Any] = resp.json()
        return answer
    raise AssertionError("client_errors exits")  # pragma: no cover


def _fail_input(message: str) -> NoReturn:
    from aigcq.cli.common import fail

    fail(message, 2)
