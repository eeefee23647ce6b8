"""What every ``aigcq`` command shares: the consoles, one-line failures, settings."""

from __future__ import annotations

from typing import NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from aigcq.config import ConfigError, PlatformConfig, Settings

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int, cause: Exception) -> NoReturn:
    """One red line on stderr, then exit with ``code``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code) from cause


def load_settings() -> Settings:
    """Settings, or exit 2 naming the malformed variable (e.g. a non-numeric port)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        fail(f"configuration error: {'; '.join(problems)}", 2, exc)


def load_config(workers: int = 0) -> tuple[Settings, PlatformConfig]:
    settings = load_settings()
    if workers > 0:
        settings.workers = workers
    try:
        config = PlatformConfig.load(settings.config_dir)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", 2, exc)
    return settings, config
