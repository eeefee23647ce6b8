"""What every ``aigcq`` command shares: the consoles, one-line failures, settings.

The settings (pydantic) are imported when a command reads them, not with the command line:
``aigcq --help`` and a client command given ``--server`` never need them.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from aigcq.plumbing.ports import busy_port

if TYPE_CHECKING:
    from aigcq.config import PlatformConfig, Settings

LogLevelOption = Annotated[
    str, typer.Option(help="Least severe log level shown: DEBUG, INFO, WARNING, ERROR")
]
HostOption = Annotated[str, typer.Option(help="Address to listen on")]
PortOption = Annotated[int, typer.Option(help="Port to listen on")]

console = Console()
err_console = Console(stderr=True)


def error_line(message: str) -> None:
    """``error: <message>`` on stderr, one line (``message`` is not markup)."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)


def fail(message: str, code: int, cause: Exception | None = None) -> NoReturn:
    """One red line on stderr, then exit with ``code``."""
    error_line(message)
    raise typer.Exit(code) from cause


def on_terminal() -> bool:
    """Whether stdout is a terminal: only there may a banner show a secret. Anywhere else
    (a log file, a service's journal) keeps every line, so no secret goes there."""
    return sys.stdout.isatty()


def generated_line(name: str, value: str, kept: str) -> str:
    """A banner's line for a secret generated now (``kept``: where it is kept): its value
    on a terminal only."""
    shown = f": [bold]{escape(value)}[/bold]" if on_terminal() else ""
    return f"  generated {name}{shown} (kept in {escape(kept)})"


def require_free_ports(
    host: str, ports: Iterable[tuple[int, str]], *, reuse_port: bool = False
) -> None:
    """Before a process says where it listens: each of ``ports`` (with the setting that
    moves it) can be listened on, else one line naming the port and that setting, exit 1.
    ``reuse_port``: a worker, sharing its ports with its siblings."""
    problem = busy_port(host, ports, reuse_port=reuse_port)
    if problem is not None:
        fail(problem, 1)


def load_settings() -> Settings:
    """Settings, or exit 2 naming the malformed variable (e.g. a non-numeric port)."""
    from pydantic import ValidationError

    from aigcq.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        problems = (
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        fail(f"configuration error: {'; '.join(problems)}", 2, exc)


def load_config(workers: int = 0) -> tuple[Settings, PlatformConfig]:
    from aigcq.config import ConfigError, PlatformConfig

    settings = load_settings()
    if workers > 0:
        settings.workers = workers
    try:
        config = PlatformConfig.load(settings.config_dir)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", 2, exc)
    unknown = unknown_platform(config)
    if unknown:
        fail(f"configuration error: {settings.config_dir / 'model.json'}: {unknown}", 2)
    beyond = config.minimums_beyond(settings.internal_capacity_max)
    if beyond:
        fail(f"configuration error: {settings.config_dir / 'model.json'}: {beyond}", 2)
    return settings, config


def unknown_platform(config: PlatformConfig) -> str:
    """What names a platform nothing here runs (``""``: none does), e.g. ``comfyiu``."""
    from aigcq.platforms.registry import specs

    known = {"comfyui"} | {p for spec in specs() for p in spec.adapter.serves}
    for aigc, platform in config.queues():
        if platform not in known:
            close = difflib.get_close_matches(platform, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            names = ", ".join(sorted(known))
            return f"{aigc}.{platform}: no platform {platform!r} (known: {names}){hint}"
    return ""
