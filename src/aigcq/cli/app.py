"""The ``aigcq`` command: the server processes, and the full app, where every sub-command
is registered (:mod:`aigcq.cli.entry` runs a client command without the others).

Logging is configured by the command line entry points and nowhere else.
"""

from typing import Annotated

import typer

from aigcq.agent.cli import bridge
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


app.command()(bridge)  # the bridge's own command (aigcq-bridge), here as `aigcq bridge`
