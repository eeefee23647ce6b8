"""``aigcq bridges drain`` / ``undrain``: no new tasks for a bridge (the ones it runs
finish), and tasks again. Admin token.

A drain is kept by the aigcq process that ``--server`` reaches, across the bridge's
reconnections; other processes sharing the Redis keep their own (``aigcq status`` through
each shows its view). A bridge id that never connected is refused, changing nothing, unless
``--ahead`` (drain it before it first connects).
"""

from typing import Annotated, Any
from urllib.parse import quote

import typer

from aigcq.cli.common import console
from aigcq.cli.remote import AdminTokenOption, ServerOption, api

bridges_app = typer.Typer(no_args_is_help=True, help="Drain and undrain bridges.")

BridgeId = Annotated[str, typer.Argument(help="The bridge's id, as `aigcq status` lists it")]
AheadOption = Annotated[
    bool, typer.Option("--ahead", help="Also a bridge that has not connected yet")
]


@bridges_app.command("drain")
def drain(
    bridge_id: BridgeId,
    ahead: AheadOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """No new tasks for BRIDGE_ID; the ones it runs finish."""
    console.print(_set_drained(bridge_id, "drain", ahead, server, token), highlight=False)


@bridges_app.command("undrain")
def undrain(
    bridge_id: BridgeId,
    ahead: AheadOption = False,
    server: ServerOption = None,
    token: AdminTokenOption = "",
) -> None:
    """Assign tasks to BRIDGE_ID again."""
    console.print(_set_drained(bridge_id, "undrain", ahead, server, token), highlight=False)


def _set_drained(bridge_id: str, action: str, ahead: bool, server: str | None, token: str) -> str:
    path = f"/api/admin/bridges/{quote(bridge_id, safe='')}/{action}"
    with api(server, token) as server_api:
        answer = server_api.post(path, ahead=str(ahead).lower())
    return outcome(answer)


def outcome(answer: dict[str, Any]) -> str:
    """What the drain (or undrain) did, in a line."""
    bridge = answer["bridgeId"]
    verb = "drained" if answer["drained"] else "undrained"
    if answer["connected"]:
        effect = "no new tasks, the ones it runs finish" if answer["drained"] else "gets tasks"
        return f"{bridge}: {verb}: {effect}"
    if not answer.get("known"):
        return f"{bridge}: {verb} ahead: it has never connected; kept for when it does"
    return (
        f"{bridge}: {verb} on this server; it is not connected here now (offline, or on "
        "another aigcq process, which keeps its own drains)"
    )
