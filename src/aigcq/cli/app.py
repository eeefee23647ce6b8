"""The ``aigcq`` command: the server processes, and where every sub-command is registered.

Logging is configured by the command line entry points and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from aigcq.asynch.cli import asynch_app
from aigcq.cli.client import status, submit, tasks_app
from aigcq.cli.common import console, load_config, load_settings
from aigcq.cli.emulate import emulate_app
from aigcq.config import PlatformConfig, Settings
from aigcq.observability.logconfig import LOG_FORMAT_ENV, LogFormat, configure_logging

app = typer.Typer(no_args_is_help=True, help="aigcq: AIGC task queue, internal GPUs first.")
app.command()(submit)
app.command()(status)
app.add_typer(tasks_app, name="tasks")
app.add_typer(emulate_app, name="emulate")
app.add_typer(asynch_app, name="asynch")


@app.callback()
def _global_options(
    log_format: Annotated[
        LogFormat, typer.Option(envvar=LOG_FORMAT_ENV, help="Log lines as text or JSON objects.")
    ] = LogFormat.TEXT,
) -> None:
    # Through the environment, so child processes (``up --demo``) log the same way.
    os.environ[LOG_FORMAT_ENV] = log_format.value


WorkersOption = Annotated[
    int, typer.Option(help="Server processes on the same ports (default: AIGCQ_WORKERS, 1)")
]


@app.command()
def up(
    log_level: str = "INFO",
    demo: Annotated[
        bool, typer.Option(help="Also run emulated GPUs (ComfyUI + bridge) and RunningHub")
    ] = False,
    workers: WorkersOption = 0,
) -> None:
    """Run the server; starts a private Redis under ./.aigcq when AIGCQ_REDIS_URL is unset."""
    from aigcq.service.launch import ensure_secrets, listen_ports, run_with_redis

    configure_logging(log_level)
    if demo:
        from aigcq.cli.demo import run as run_demo

        run_demo(Settings(), console)
        return
    settings, config = load_config(workers)
    fresh = ensure_secrets(settings)
    _print_banner(settings, config, fresh, listen_ports(settings))
    run_with_redis(settings, config, embedded_dir=settings.data_dir / "redis")


@app.command()
def serve(log_level: str = "INFO", workers: WorkersOption = 0) -> None:
    """Run the server against AIGCQ_REDIS_URL (several processes may share one Redis)."""
    from aigcq.service.launch import run_with_redis

    configure_logging(log_level)
    settings, config = load_config(workers)
    if not settings.redis_url:
        console.print("[red]AIGCQ_REDIS_URL is required for `serve` (`up` embeds one)[/red]")
        raise typer.Exit(2)
    # Not run_async(serve(...)) directly: uvicorn re-raises SIGTERM after its graceful
    # shutdown, which with the default handler kills the process (exit -15 / 143).
    # run_with_redis (no embedded Redis: the URL is set) turns it into a clean exit 0.
    run_with_redis(settings, config, embedded_dir=settings.data_dir / "redis")


def _print_banner(
    settings: Settings, config: PlatformConfig, fresh: dict[str, str], ports: list[int]
) -> None:
    host = settings.host
    console.print(f"[bold]aigcq[/bold] listening on {', '.join(f'{host}:{p}' for p in ports)}")
    console.print(f"  clients    ws://{host}:{settings.ws_port}/?token=<token>&id=<backendId>")
    console.print(f"  HTTP API   http://{host}:{settings.ws_port}/docs")
    console.print(f"  callbacks  {settings.public_callback_base()}/callback/all")
    console.print(
        f"  redis      {settings.redis_url or 'embedded, data in ' + str(settings.data_dir)}"
    )
    if not config.queues():
        console.print(f"  [yellow]no platforms configured: add {settings.config_dir}/model.json[/]")
    for name, value in fresh.items():
        console.print(f"  generated {name}: [bold]{value}[/bold] (kept in {settings.data_dir})")


@app.command()
def dispatcher(log_level: str = "INFO") -> None:
    """Run the message-dispatcher (seed 000): bridges at /ws, JWT API, RunningHub routes.

    Port AIGCQ_MD_PORT (4000), Redis prefix AIGCQ_MD_PREFIX (md), login MD_USERNAME /
    MD_PASSWORD; an unset password is generated and printed once.
    """
    from aigcq.dispatcher.service import prepare, run

    configure_logging(log_level)
    md, settings, fresh = prepare()
    console.print(f"[bold]message-dispatcher[/bold] on http://{settings.host}:{md.port}")
    console.print(f"  bridges    ws://{settings.host}:{md.port}/ws?token=<bridge token>")
    console.print(f"  login      POST /api/auth/login as {md.username!r}")
    for name, value in fresh.items():
        console.print(f"  generated {name}: [bold]{value}[/bold] (kept in {settings.data_dir})")
    run(md, settings)


@app.command()
def token(backend_id: str, ttl: int = 86400) -> None:
    """Print a client JWT for BACKEND_ID signed with TOKEN_SECRET."""
    from aigcq.gateway.auth import issue_client_token
    from aigcq.service.launch import ensure_secrets

    settings = load_settings()
    ensure_secrets(settings)
    typer.echo(issue_client_token(settings.token_secret, backend_id, ttl))


@app.command()
def bridge(
    server: Annotated[str | None, typer.Option(help="aigcq bridge URL, ws://host:port/ws")] = None,
    token: Annotated[str | None, typer.Option(help="Bridge token (AIGCQ_BRIDGE_TOKEN)")] = None,
    comfyui: Annotated[
        list[str] | None, typer.Option(help="ComfyUI base URL; repeat for more instances")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address of the admin/files server")] = None,
    port: Annotated[int | None, typer.Option(help="Port of the admin/files server [8190]")] = None,
    public_url: Annotated[str | None, typer.Option(help="Base of fileUrls")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="State dir [.aigcq/bridge]")] = None,
    workflows: Annotated[Path | None, typer.Option(help="Folder of <workflowId>.json")] = None,
    heartbeat: Annotated[float | None, typer.Option(help="HEARTBEAT interval, s [30]")] = None,
    log_level: str = "INFO",
) -> None:
    """Run the reference bridge: connects out to aigcq and drives ComfyUI instances.

    Every option may also come from AIGCQ_BRIDGE_<NAME> (e.g. AIGCQ_BRIDGE_SERVER).
    """
    from aigcq.agent.app import run
    from aigcq.agent.settings import BridgeSettings

    configure_logging(log_level)
    given: dict[str, Any] = {
        "server": server,
        "token": token,
        "comfyui": comfyui or None,
        "host": host,
        "http_port": port,
        "public_url": public_url,
        "data_dir": data_dir,
        "workflows": workflows,
        "heartbeat": heartbeat,
    }
    run(BridgeSettings(**{k: v for k, v in given.items() if v is not None}))


def main() -> None:
    app()
