"""The bridge's command line: ``aigcq-bridge`` (and ``python -m aigcq.agent``), which the
server's command line also offers as ``aigcq bridge``. It needs nothing of the server.
"""

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from aigcq.observability.logconfig import configure_logging
from aigcq.plumbing.ports import busy_port

LogLevelOption = Annotated[
    str, typer.Option(help="Least severe log level shown: DEBUG, INFO, WARNING, ERROR")
]


def fail(message: str, code: int, cause: Exception | None = None) -> NoReturn:
    """``error: <message>`` on stderr, then exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code) from cause


def _given(help: str, **extra: Any) -> Any:
    """An option that is unset unless given (its default lives in BridgeSettings)."""
    return typer.Option(show_default=False, help=help, **extra)


def bridge(
    server: Annotated[str | None, _given("aigcq's bridge URL, ws://host:port/ws")] = None,
    token: Annotated[
        str | None,
        _given("Bridge token; visible to `ps`: prefer AIGCQ_BRIDGE_TOKEN or --token-file"),
    ] = None,
    token_file: Annotated[
        Path | None,
        _given("File holding the bridge token (e.g. chmod 600)", envvar="AIGCQ_BRIDGE_TOKEN_FILE"),
    ] = None,
    comfyui: Annotated[
        list[str] | None,
        _given("ComfyUI base URL; repeat for more instances [default: http://127.0.0.1:8188]"),
    ] = None,
    host: Annotated[
        str | None, _given("Bind address of the admin/files server [default: 127.0.0.1]")
    ] = None,
    port: Annotated[int | None, _given("Port of the admin/files server [default: 8190]")] = None,
    public_url: Annotated[
        str | None, _given("Base of fileUrls [default: http://<host>:<port>]")
    ] = None,
    data_dir: Annotated[Path | None, _given("State dir [default: .aigcq/bridge]")] = None,
    workflows: Annotated[Path | None, _given("Folder of <workflowId>.json")] = None,
    heartbeat: Annotated[float | None, _given("Seconds between HEARTBEATs [default: 30]")] = None,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run the reference bridge: connects out to aigcq and drives ComfyUI instances.

    Every option may also come from AIGCQ_BRIDGE_<NAME> (e.g. AIGCQ_BRIDGE_SERVER,
    AIGCQ_BRIDGE_TOKEN) or ./.env.
    """
    # imported when the bridge runs, not when a command line that offers it is built
    from aigcq.agent.app import run
    from aigcq.agent.settings import BridgeSettings

    configure_logging(log_level)
    given: dict[str, Any] = {
        "server": server,
        "token": token if token is not None else read_token_file(token_file),
        "comfyui": comfyui or None,
        "host": host,
        "http_port": port,
        "public_url": public_url,
        "data_dir": data_dir,
        "workflows": workflows,
        "heartbeat": heartbeat,
    }
    settings = BridgeSettings(**{k: v for k, v in given.items() if v is not None})
    problem = busy_port(settings.host, [(settings.http_port, "--port or AIGCQ_BRIDGE_HTTP_PORT")])
    if problem is not None:
        fail(problem, 1)
    run(settings)


def read_token_file(path: Path | None) -> str | None:
    """The token in ``path`` (surrounding whitespace dropped); one line and exit 2 if unreadable."""
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the token file {path}: {exc.strerror}", 2, exc)


def main() -> None:
    """The ``aigcq-bridge`` console script."""
    typer.run(bridge)
