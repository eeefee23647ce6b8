"""The ``aigcq`` command: the server processes, and the full app, where every sub-command
is registered (:mod:`aigcq.cli.entry` runs a client command without the others).

Logging is configured by the command line entry points and nowhere else.
"""

from pathlib import Path
from typing import Annotated, Any

import typer

from aigcq.cli.command_table import LAZY, register, root
from aigcq.cli.common import (
    LogLevelOption,
    console,
    fail,
    generated_line,
    load_config,
    load_settings,
    require_free_ports,
)
from aigcq.observability.logconfig import configure_logging

app = root()
for _name in LAZY:
    register(app, _name)


WorkersOption = Annotated[
    int,
    typer.Option(
        show_default=False,
        help="Server processes sharing the same ports [default: AIGCQ_WORKERS, else 1]",
    ),
]


@app.command()
def up(
    log_level: LogLevelOption = "INFO",
    demo: Annotated[
        bool, typer.Option(help="Also run emulated GPUs (ComfyUI + bridge) and RunningHub")
    ] = False,
    workers: WorkersOption = 0,
) -> None:
    """Run the server; starts a private Redis under ./.aigcq when AIGCQ_REDIS_URL is unset.

    It reads ./config/ and ./.env once, at start: restart it after changing them.
    """
    from aigcq.cli.banner import print_banner
    from aigcq.serve.launch import ensure_secrets, listen_settings, run_with_redis

    configure_logging(log_level)
    if demo:
        from aigcq.cli.demo import run as run_demo

        settings = load_settings()
        require_free_ports(settings.host, listen_settings(settings))
        run_demo(settings, console)
        return
    settings, config = load_config(workers)
    require_free_ports(settings.host, listen_settings(settings))
    fresh = ensure_secrets(settings)
    run_with_redis(
        settings,
        config,
        embedded_dir=settings.data_dir / "redis",
        on_listening=lambda: print_banner(settings, config, fresh),  # once it does
    )


@app.command()
def serve(log_level: LogLevelOption = "INFO", workers: WorkersOption = 0) -> None:
    """Run the server against AIGCQ_REDIS_URL (several processes may share one Redis)."""
    from aigcq.serve.launch import listen_settings, require_signing_key, run_with_redis

    configure_logging(log_level)
    settings, config = load_config(workers)
    if not settings.redis_url:
        console.print("[red]AIGCQ_REDIS_URL is required for `serve` (`up` embeds one)[/red]")
        raise typer.Exit(2)
    require_signing_key(settings)  # what to configure first; then whether the ports are free
    require_free_ports(settings.host, listen_settings(settings), reuse_port=settings.reuse_port)
    # Not run_async(serve(...)) directly: uvicorn re-raises SIGTERM after its graceful
    # shutdown, which with the default handler kills the process (exit -15 / 143).
    # run_with_redis (no embedded Redis: the URL is set) turns it into a clean exit 0.
    run_with_redis(settings, config, embedded_dir=settings.data_dir / "redis")


@app.command()
def dispatcher(log_level: LogLevelOption = "INFO") -> None:
    """Run the message-dispatcher (the original system's GPU front): bridges at /ws, JWT API,
    RunningHub-compatible routes.

    Port AIGCQ_MD_PORT (4000), Redis prefix AIGCQ_MD_PREFIX (md), login MD_USERNAME /
    MD_PASSWORD; an unset password is generated and printed once.
    """
    from aigcq.dispatcher.process import prepare, run

    configure_logging(log_level)
    md, settings, fresh = prepare()
    require_free_ports(settings.host, [(md.port, "AIGCQ_MD_PORT")])
    console.print(f"[bold]message-dispatcher[/bold] on http://{settings.host}:{md.port}")
    console.print(f"  bridges    ws://{settings.host}:{md.port}/ws?token=<bridge token>")
    console.print(f"  login      POST /api/auth/login as {md.username!r}")
    for name, value in fresh.items():
        console.print(generated_line(name, value, str(settings.data_dir)))
    run(md, settings)


@app.command()
def token(
    backend_id: Annotated[str, typer.Argument(help="The client (backend) the token names")],
    ttl: Annotated[int, typer.Option(min=1, help="Seconds the token stays valid")] = 86400,
    ids: Annotated[
        list[str] | None,
        typer.Option("--id", help="Another client id the token may use (repeat for more)"),
    ] = None,
) -> None:
    """Print a client JWT for BACKEND_ID signed with the server's TOKEN_SECRET.

    The token may connect as, submit for, read and cancel the tasks of BACKEND_ID and each
    --id, and no other id; its quota is BACKEND_ID's. Run it in the server's folder: the
    secret comes from TOKEN_SECRET (environment or ./.env) or the server's secrets file
    (AIGCQ_DATA_DIR/secrets.json).
    """
    from aigcq.plumbing.auth import issue_client_token

    settings = load_settings()
    if not settings.token_secret:
        settings.token_secret = settings.stored_secrets().get("token_secret", "")
        if not settings.token_secret:
            fail(
                f"no server secret here: TOKEN_SECRET is unset (environment, ./.env) and "
                f"{settings.secrets_file.resolve()} has none; run this where `aigcq up` runs",
                2,
            )
    typer.echo(issue_client_token(settings.token_secret, backend_id, ttl, ids or ()))


def _given(help: str, **extra: Any) -> Any:
    """An option that is unset unless given (its default lives in BridgeSettings)."""
    return typer.Option(show_default=False, help=help, **extra)


@app.command()
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
    require_free_ports(settings.host, [(settings.http_port, "--port or AIGCQ_BRIDGE_HTTP_PORT")])
    run(settings)


def read_token_file(path: Path | None) -> str | None:
    """The token in ``path`` (surrounding whitespace dropped); one line and exit 2 if unreadable."""
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the token file {path}: {exc.strerror}", 2, exc)
