"""The one ``aigcq`` command. Logging is configured here and nowhere else."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from aigcq.config import ConfigError, PlatformConfig, Settings
from aigcq.jsonlog import JsonFormatter, RedactSecrets, TextFormatter

if TYPE_CHECKING:
    import httpx
    from rich.console import Group

    from aigcq.client import AigcqError

app = typer.Typer(no_args_is_help=True, help="aigcq: AIGC task queue, internal GPUs first.")
emulate_app = typer.Typer(no_args_is_help=True, help="Run an emulator of an external service.")
app.add_typer(emulate_app, name="emulate")
console = Console()
err_console = Console(stderr=True)
LOG_FORMAT_ENV = "AIGCQ_LOG_FORMAT"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


@app.callback()
def _global_options(
    log_format: Annotated[
        LogFormat, typer.Option(envvar=LOG_FORMAT_ENV, help="Log lines as text or JSON objects.")
    ] = LogFormat.TEXT,
) -> None:
    # Through the environment, so child processes (``up --demo``) log the same way.
    os.environ[LOG_FORMAT_ENV] = log_format.value


def configure_logging(level: str = "INFO") -> None:
    """Root logging at ``level``, as text or JSON lines (``AIGCQ_LOG_FORMAT``)."""
    handler = logging.StreamHandler()
    if os.environ.get(LOG_FORMAT_ENV, "").lower() == LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # One line per outgoing request is noise at thousands of tasks a second.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))


WorkersOption = Annotated[
    int, typer.Option(help="Server processes on the same ports (default: AIGCQ_WORKERS, 1)")
]


def _fail(message: str, code: int, cause: Exception) -> NoReturn:
    """One red line on stderr, then exit with ``code``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code) from cause


def _settings() -> Settings:
    """Settings, or exit 2 naming the malformed variable (e.g. a non-numeric port)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _fail(f"configuration error: {'; '.join(problems)}", 2, exc)


def _load_config(workers: int = 0) -> tuple[Settings, PlatformConfig]:
    settings = _settings()
    if workers > 0:
        settings.workers = workers
    try:
        config = PlatformConfig.load(settings.config_dir)
    except ConfigError as exc:
        _fail(f"configuration error: {exc}", 2, exc)
    return settings, config


@app.command()
def up(
    log_level: str = "INFO",
    demo: Annotated[
        bool, typer.Option(help="Also run emulated GPUs (ComfyUI + bridge) and RunningHub")
    ] = False,
    workers: WorkersOption = 0,
) -> None:
    """Run the server; starts a private Redis under ./.aigcq when AIGCQ_REDIS_URL is unset."""
    from aigcq.launch import ensure_secrets, listen_ports, run_with_redis

    configure_logging(log_level)
    if demo:
        from aigcq.demo import run as run_demo

        run_demo(Settings(), console)
        return
    settings, config = _load_config(workers)
    fresh = ensure_secrets(settings)
    _print_banner(settings, config, fresh, listen_ports(settings))
    run_with_redis(settings, config, embedded_dir=settings.data_dir / "redis")


@app.command()
def serve(log_level: str = "INFO", workers: WorkersOption = 0) -> None:
    """Run the server against AIGCQ_REDIS_URL (several processes may share one Redis)."""
    from aigcq.launch import run_with_redis

    configure_logging(log_level)
    settings, config = _load_config(workers)
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
    from aigcq.launch import ensure_secrets

    settings = _settings()
    ensure_secrets(settings)
    typer.echo(issue_client_token(settings.token_secret, backend_id, ttl))


# ---- client commands: submit, status, tasks show ---------------------------------------
# They talk to a running server; what can be expected to go wrong (no token, bad input, the
# server down or refusing) is one line on stderr and exit 1 (the server) or 2 (the input).

TOKEN_ENV = "AIGCQ_CLIENT_TOKEN"
ServerOption = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="aigcq's address (default: where `aigcq up` listens: AIGCQ_HOST, AIGCQ_WS_PORT)",
    ),
]
TokenOption = Annotated[
    str,
    typer.Option(envvar=TOKEN_ENV, show_default=False, help="Client token (`aigcq token ID`)"),
]


class InputError(Exception):
    """A bad argument, token or input file (exit code 2)."""


@contextlib.contextmanager
def client_errors(server: str) -> Iterator[None]:
    """Report the failures a client command can expect as one line and an exit code."""
    import httpx
    from websockets.exceptions import WebSocketException

    from aigcq.cli_status import StatusError
    from aigcq.client import AigcqError

    try:
        yield
    except InputError as exc:
        _fail(str(exc), 2, exc)
    except AigcqError as exc:
        _fail(_refusal(exc), 1, exc)
    except StatusError as exc:
        _fail(str(exc), 1, exc)
    except (OSError, httpx.TransportError, WebSocketException) as exc:
        reason = str(exc) or type(exc).__name__
        _fail(f"cannot reach the aigcq server at {server}: {reason}", 1, exc)


def _refusal(exc: AigcqError) -> str:
    """``AuthError: <the server's message> (<detail>)``."""
    detail = f" ({exc.detail})" if exc.detail else ""
    return f"{exc.code}: {exc.msg or 'refused by the server'}{detail}"


_SECURE = {"http": "", "ws": "", "https": "s", "wss": "s"}


def server_url(server: str | None, scheme: str) -> str:
    """Where a client command connects, with its scheme (``ws`` or ``http``): ``server``
    (``http://`` and ``ws://`` both work) or, by default, where ``aigcq up`` with the same
    settings (``AIGCQ_HOST``, ``AIGCQ_WS_PORT``, environment or ``.env``) listens."""
    if server is None:
        settings = _settings()
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(settings.host)
        host = host or settings.host
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{settings.ws_port}/"
    given, sep, rest = server.partition("://")
    if not sep:
        return f"{scheme}://{server}"
    secure = _SECURE.get(given.lower())
    return server if secure is None else f"{scheme}{secure}://{rest}"


def _require_token(token: str) -> str:
    if not token:
        raise InputError(f"no token: pass --token or set {TOKEN_ENV} (`aigcq token ID` prints one)")
    return token


def token_subject(token: str) -> str | None:
    """A JWT's ``sub`` (signature unchecked): ``aigcq submit`` submits as the backend the token
    speaks for, so the same token may cancel the task, and AIGCQ_BIND_CLIENT_IDS lets it in."""
    import jwt

    try:
        sub = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.PyJWTError:
        return None
    return sub if isinstance(sub, str) and sub else None


def _read_payload(payload: str) -> dict[str, Any]:
    """``payload`` (JSON, or ``@file.json``) as a JSON object; :class:`InputError` if not."""
    import json

    if payload.startswith("@"):
        try:
            payload = Path(payload[1:]).read_text()
        except OSError as exc:
            raise InputError(f"cannot read payload file {payload[1:]}: {exc.strerror}") from exc
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise InputError(f"payload is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InputError(f"payload must be a JSON object, not {type(body).__name__}")
    return body


@app.command()
def submit(
    platform: str,
    payload: Annotated[str, typer.Argument(help="JSON, or @file.json")],
    server: ServerOption = None,
    token: TokenOption = "",
    backend_id: Annotated[
        str | None,
        typer.Option(show_default=False, help="Submit as (default: the token's JWT sub, else cli)"),
    ] = None,
    aigc: str | None = None,
    task_id: str | None = None,
    timeout: float = 600.0,
) -> None:
    """Submit one task over the client WebSocket, show progress and print the result."""
    import asyncio
    import json

    from aigcq.cli_client import submit_and_wait

    url = server_url(server, "ws")
    with client_errors(url):
        token = _require_token(token)
        result = asyncio.run(
            submit_and_wait(
                url,
                token,
                backend_id or token_subject(token) or "cli",
                platform,
                _read_payload(payload),
                task_id=task_id,
                aigc=aigc or None,
                timeout=timeout,
                console=console,
            )
        )
    typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
    if result.get("status") != "success":
        raise typer.Exit(1)


@contextlib.contextmanager
def _http(server: str | None, token: str) -> Iterator[httpx.Client]:
    """An HTTP client for the server's API, inside :func:`client_errors`."""
    import httpx

    url = server_url(server, "http")
    with client_errors(url):
        headers = {"Authorization": f"Bearer {_require_token(token)}"}
        with httpx.Client(base_url=url, headers=headers) as http:
            yield http


@app.command()
def status(
    server: ServerOption = None,
    token: TokenOption = "",
    limit: int = 10,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: float = 2.0,
) -> None:
    """Bridges, health (with an admin token), queues and recent tasks as tables."""
    from aigcq.cli_status import fetch_snapshot, render

    with _http(server, token) as http:
        view = render(fetch_snapshot(http, limit))
        if watch:
            _watch(http, view, limit, interval)
            return
    console.print(view)


def _watch(http: httpx.Client, view: Group, limit: int, interval: float) -> None:
    """Redraw the status tables every ``interval`` seconds until Ctrl-C."""
    import time

    from rich.live import Live

    from aigcq.cli_status import fetch_snapshot, render

    try:
        with Live(view, console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(fetch_snapshot(http, limit)))
    except KeyboardInterrupt:
        return


tasks_app = typer.Typer(no_args_is_help=True, help="Inspect tasks.")
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("show")
def tasks_show(task_id: str, server: ServerOption = None, token: TokenOption = "") -> None:
    """Print a task's timeline: every transition with its time, target and attempt."""
    from aigcq.cli_status import timeline

    with _http(server, token) as http:
        table = timeline(http, task_id)
    console.print(table)


# ---- sub-applications (each owned by its package) --------------------------------------
# (added below by the packages that provide them)
from aigcq.asynch.cli import asynch_app  # noqa: E402

app.add_typer(asynch_app, name="asynch")


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


@emulate_app.command("comfyui")
def emulate_comfyui(
    host: str = "127.0.0.1",
    port: int = 8188,
    step_time: Annotated[float, typer.Option(help="Seconds per progress step")] = 0.05,
    steps: Annotated[int, typer.Option(help="Progress steps per executed node")] = 4,
    fail_rate: Annotated[float, typer.Option(help="Probability a prompt fails")] = 0.0,
    output_dir: Path = Path(".aigcq/comfyui/output"),
    log_level: str = "INFO",
) -> None:
    """Run a ComfyUI emulator (EmptyImage, ImageInvert, SaveImage, PreviewImage)."""
    from aigcq.emulators.comfyui import ComfyUIConfig, run

    configure_logging(log_level)
    config = ComfyUIConfig(
        output_dir=output_dir, step_time=step_time, steps=steps, fail_rate=fail_rate
    )
    run(host, port, config)


@emulate_app.command("model-service")
def emulate_model_service(
    host: str = "127.0.0.1",
    port: int = 8092,
    latency: Annotated[float, typer.Option(help="Seconds per call")] = 0.0,
    failure_rate: Annotated[float, typer.Option(help="Share of calls answered HTTP 500")] = 0.0,
    response: Annotated[str, typer.Option(help="json | text | image")] = "json",
    log_level: str = "WARNING",
) -> None:
    """Run an HTTP model service emulator (stats at /_emulator/stats)."""
    from aigcq.emulators.model_service import ModelBehaviour, run

    configure_logging(log_level)
    run(host, port, ModelBehaviour(latency, failure_rate, response))  # type: ignore[arg-type]


@emulate_app.command("oss")
def emulate_oss(host: str = "127.0.0.1", port: int = 8093, log_level: str = "WARNING") -> None:
    """Run the OSS file service emulator (oss/file/uploadFile)."""
    from aigcq.emulators.oss import run

    configure_logging(log_level)
    run(host, port)


@emulate_app.command("prompts-core")
def emulate_prompts_core(
    host: str = "127.0.0.1", port: int = 8094, log_level: str = "WARNING"
) -> None:
    """Run the prompts-core emulator (prompt/createPrompt)."""
    from aigcq.emulators.prompts_core import run

    configure_logging(log_level)
    run(host, port)


_ApiKeys = Annotated[
    list[str] | None, typer.Option("--api-key", help="Accepted key; repeat. Default: any")
]
_Duration = Annotated[float, typer.Option("--duration", help="Seconds a task runs (0 = instant)")]
_FailureRate = Annotated[float, typer.Option(help="Share of tasks that fail, 0..1")]


@emulate_app.command("runninghub")
def emulate_runninghub(
    host: str = "127.0.0.1",
    port: int = 9101,
    max_concurrent: Annotated[int, typer.Option(help="QUEUED+RUNNING per apiKey, then 421")] = 3,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    api_key: _ApiKeys = None,
    log_level: str = "INFO",
) -> None:
    """Run a RunningHub emulator (/task/openapi/*, webhooks; stats at /_emulator/stats)."""
    from aigcq.emulators.runninghub import run

    configure_logging(log_level)
    run(
        host,
        port,
        max_concurrent=max_concurrent,
        duration_s=duration,
        failure_rate=failure_rate,
        api_keys=set(api_key) if api_key else None,
    )


@emulate_app.command("coze")
def emulate_coze(
    host: str = "127.0.0.1",
    port: int = 9102,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    api_key: _ApiKeys = None,
    log_level: str = "INFO",
) -> None:
    """Run a Coze emulator (workflow run + run_histories; stats at /_emulator/stats)."""
    from aigcq.emulators.coze import run

    configure_logging(log_level)
    run(
        host,
        port,
        duration_s=duration,
        failure_rate=failure_rate,
        tokens=set(api_key) if api_key else None,
    )


@emulate_app.command("jimuai")
def emulate_jimuai(
    host: str = "127.0.0.1",
    port: int = 9103,
    access_key: Annotated[str, typer.Option(help="Accepted access key")] = "AKLTemulator",
    secret_key: Annotated[
        str, typer.Option(help="Its secret key", envvar="AIGCQ_EMULATOR_JIMUAI_SK")
    ] = "emulator-secret",
    max_concurrent: Annotated[
        int, typer.Option(help="in_queue+generating per key, then 50430")
    ] = 5,
    qps: Annotated[
        float, typer.Option(help="Submits per second per key, then 50429 (0 = any)")
    ] = 0.0,
    queue_s: Annotated[float, typer.Option("--queue", help="Seconds in_queue")] = 0.0,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    base64_only: Annotated[bool, typer.Option(help="Results only as base64")] = False,
    log_level: str = "INFO",
) -> None:
    """Run a JimuAI (即梦, Volcengine visual API) emulator: signed CVSync2AsyncSubmitTask /
    CVSync2AsyncGetResult; stats at /_emulator/stats, failures via /_emulator/inject."""
    from aigcq.emulators.jimuai import run

    configure_logging(log_level)
    run(
        host,
        port,
        credentials={access_key: secret_key},
        max_concurrent=max_concurrent,
        qps=qps,
        queue_s=queue_s,
        duration_s=duration,
        failure_rate=failure_rate,
        base64_only=base64_only,
    )


def main() -> None:
    app()
