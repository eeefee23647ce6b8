"""The table of the commands :mod:`aigcq.cli.entry` may build alone, and the root app
they are built in; :mod:`aigcq.cli.app` registers the same table in the full app.

The command modules evaluate their annotations when they are defined (no ``from
__future__ import annotations``): typer reads every command's signature at each start,
and a string annotation costs it an evaluation each time.
"""

import os
from collections.abc import Callable
from importlib import import_module
from typing import Annotated

import typer

from aigcq.cli import deferred, help_style, plain_params
from aigcq.observability.logconfig import LOG_FORMAT_ENV, LogFormat

#: command -> (its module, the name there, a group of commands?): commands that need
#: nothing of the others
LAZY: dict[str, tuple[str, str, bool]] = {
    "submit": ("aigcq.cli.client", "submit", False),
    "status": ("aigcq.cli.client", "status", False),
    "tasks": ("aigcq.cli.tasks", "tasks_app", True),
    "bridges": ("aigcq.cli.bridges", "bridges_app", True),
    "pause": ("aigcq.cli.controls", "pause", False),
    "resume": ("aigcq.cli.controls", "resume", False),
    "emulate": ("aigcq.cli.emulate", "emulate_app", True),
    "asynch": ("aigcq.asynch.cli", "asynch_app", True),
}

#: command -> the distribution that brings it, when the server does not depend on it
#: (aigcq-asynch depends on the server: the `embedded`, `asynch` and `dev` extras bring it)
OPTIONAL = {"asynch": "aigcq-asynch"}


def _global_options(
    log_format: Annotated[
        LogFormat, typer.Option(envvar=LOG_FORMAT_ENV, help="Log lines as text or JSON objects.")
    ] = LogFormat.TEXT,
) -> None:
    # Through the environment, so child processes (``up --demo``) log the same way.
    os.environ[LOG_FORMAT_ENV] = log_format.value


def root() -> typer.Typer:
    """The ``aigcq`` app with its options and no command yet."""
    deferred.apply()
    help_style.apply()
    plain_params.apply()
    app = typer.Typer(no_args_is_help=True, help="aigcq: AIGC task queue, internal GPUs first.")
    app.callback()(_global_options)
    return app


def register(app: typer.Typer, name: str) -> None:
    """Add the command ``name`` of :data:`LAZY` to ``app`` (importing its module)."""
    module, attribute, group = LAZY[name]
    try:
        found = getattr(import_module(module), attribute)
    except ModuleNotFoundError as exc:
        if name not in OPTIONAL or not module.startswith(f"{exc.name}."):
            raise
        app.command(name, help=f"(not installed: pip install {OPTIONAL[name]})")(
            _not_installed(OPTIONAL[name])
        )
        return
    if group:
        app.add_typer(found, name=name)
    else:
        app.command(name)(found)


def _not_installed(distribution: str) -> Callable[[], None]:
    def command() -> None:
        typer.echo(f"error: this command comes with {distribution}: pip install {distribution}")
        raise typer.Exit(2)

    return command
