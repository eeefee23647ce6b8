"""``aigcq asynch [serve]`` and ``aigcq asynch migrate``.

model-asynch's modules are imported when one of these commands runs, not when the
``aigcq`` command line is built: its FastAPI app alone took most of every command's start.
"""

import logging
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from aigcq.cli.common import console, generated_line, require_free_ports

if TYPE_CHECKING:
    from aigcq.asynch.settings import AsynchSettings
    from aigcq.config import Settings

log = logging.getLogger(__name__)

asynch_app = typer.Typer(help="model-asynch: async middleware for HTTP model services.")


LogLevel = Annotated[str, typer.Option(help="Logging level.")]


def _logging(level: str) -> None:
    from aigcq.observability.logconfig import configure_logging

    configure_logging(level)


@asynch_app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    """Without a sub-command: serve (with every option at its default)."""
    if ctx.invoked_subcommand is None:
        serve()


@asynch_app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Listen address (AIGCQ_ASYNCH_HOST).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (AIGCQ_ASYNCH_PORT, default 8091).")
    ] = None,
    worker: Annotated[bool | None, typer.Option(help="Run the worker loop.")] = None,
    cleaner: Annotated[bool | None, typer.Option(help="Run the cleaner loop.")] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Apply migrations and serve the API (private PostgreSQL/Redis when no URL is set)."""
    from aigcq.asynch import goconfig
    from aigcq.asynch.backing import backing_services
    from aigcq.asynch.settings import AsynchSettings
    from aigcq.config import Settings
    from aigcq.serve.launch import SignalExit, exit_on_sigterm, run_async

    _logging(log_level)
    goconfig.apply()  # the Go service's config.yml, when there is one
    overrides: dict[str, Any] = {
        "host": host, "port": port, "worker_enabled": worker, "cleaner_enabled": cleaner
    }  # fmt: skip
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = AsynchSettings(**given)
    require_free_ports(settings.host, [(settings.port, "--port or AIGCQ_ASYNCH_PORT")])
    base = Settings()
    admin_token(settings, base)
    exit_on_sigterm()
    try:
        with backing_services(base.database_url, base.redis_url, base.data_dir) as (db, rd):
            run_async(_serve(settings, db, rd, base))
    except (KeyboardInterrupt, SignalExit):  # the private servers are stopped by now
        log.info("stopped by signal")


def admin_token(settings: "AsynchSettings", base: "Settings") -> None:
    """The management routes' token: ``AIGCQ_ASYNCH_ADMIN_TOKEN``, else the one kept in
    ``AIGCQ_DATA_DIR/secrets.json`` (generated the first time, as ``aigcq up`` does its
    secrets, and printed once); say where it is. ``AIGCQ_ASYNCH_ADMIN_OPEN`` needs none."""
    from aigcq.serve.launch import ensure_secrets

    if settings.admin_open:
        log.warning(
            "AIGCQ_ASYNCH_ADMIN_OPEN is set: the management routes (/model/*, runWork,"
            " cleanWork) are open to anyone who can reach this port"
        )
        return
    given = bool(settings.admin_token)
    fresh = ensure_secrets(base, settings, ("admin_token",), key_prefix="asynch_")
    kept = base.secrets_file.resolve()
    where = "AIGCQ_ASYNCH_ADMIN_TOKEN" if given else f"asynch_admin_token in {kept}"
    need = f"  management routes (/model/*, runWork, cleanWork) need the admin token: {where}"
    lines = [escape(need)]
    lines += [generated_line(name, value, str(kept)) for name, value in fresh.items()]
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False)


async def _serve(
    settings: "AsynchSettings", database_url: str, redis_url: str, base: "Settings"
) -> None:
    import uvicorn

    from aigcq.asynch.app import create_app
    from aigcq.asynch.metrics import asynch_state
    from aigcq.asynch.migrate import migrate
    from aigcq.asynch.process import open_process
    from aigcq.observability import otel_metrics
    from aigcq.plumbing.connection_limits import bounded_config

    applied = await migrate(database_url)
    log.info("schema up to date (applied now: %s)", applied or "none")
    async with (
        open_process(
            settings, database_url=database_url, redis_url=redis_url, data_dir=base.data_dir
        ) as svc,
        svc.background(),
    ):
        app = create_app(svc, admin_token=base.admin_token, metrics_token=base.metrics_token)
        config = bounded_config(
            app,
            base,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        # what /metrics shows, pushed through OTel too when OTEL_* asks (docs/tracing.md)
        async with otel_metrics.exporting("aigcq-asynch", [asynch_state(app)]):
            await uvicorn.Server(config).serve()


@asynch_app.command("migrate")
def migrate_command(log_level: LogLevel = "INFO") -> None:
    """Apply pending schema migrations and exit."""
    import asyncio

    from aigcq.asynch import goconfig
    from aigcq.asynch.backing import backing_services
    from aigcq.asynch.migrate import SchemaMismatch, migrate
    from aigcq.config import Settings
    from aigcq.serve.launch import exit_on_sigterm

    _logging(log_level)
    goconfig.apply()
    base = Settings()
    exit_on_sigterm()
    with backing_services(base.database_url, "unused", base.data_dir) as (db, _):
        try:
            applied = asyncio.run(migrate(db))
        except SchemaMismatch as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    typer.echo(f"applied: {applied or 'nothing, schema up to date'}")
