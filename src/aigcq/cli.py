"""The one ``aigcq`` command. Logging is configured here and nowhere else."""

from __future__ import annotations

import logging

import typer

app = typer.Typer(no_args_is_help=True, help="aigcq: AIGC task queue, internal GPUs first.")
emulate_app = typer.Typer(no_args_is_help=True, help="Run an emulator of an external service.")
app.add_typer(emulate_app, name="emulate")


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# ---- sub-applications (each owned by its package) --------------------------------------
# (added below by the packages that provide them)


def main() -> None:
    app()
