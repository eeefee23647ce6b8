"""The ``aigcq`` entry point: it builds only the command it is asked to run.

Typer builds every command it has (each one's parameters read from its signature) before
it runs one, and each command's module comes with it: for ``aigcq tasks show X`` most of
that start is spent on commands that do not run. So a command of :data:`LAZY` runs in a
root app that has that command alone (the same root: its options, its help); anything else
(``aigcq --help``, a server command, a mistyped name, shell completion) runs the full app,
:data:`aigcq.cli.app.app`, which registers the same table.

The command modules evaluate their annotations when they are defined (no ``from
__future__ import annotations``): typer reads every command's signature at each start,
and a string annotation costs it an evaluation each time.
"""

import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Annotated

import typer

from aigcq.cli import help_style, plain_params
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
    "asynch": ("aigcq.cli.asynch", "asynch_app", True),
}
#: the root's own option that takes a value (``--log-format json``)
_VALUED = "--log-format"


def _global_options(
    log_format: Annotated[
        LogFormat, typer.Option(envvar=LOG_FORMAT_ENV, help="Log lines as text or JSON objects.")
    ] = LogFormat.TEXT,
) -> None:
    # Through the environment, so child processes (``up --demo``) log the same way.
    os.environ[LOG_FORMAT_ENV] = log_format.value


def root() -> typer.Typer:
    """The ``aigcq`` app with its options and no command yet."""
    help_style.apply()
    plain_params.apply()
    app = typer.Typer(no_args_is_help=True, help="aigcq: AIGC task queue, internal GPUs first.")
    app.callback()(_global_options)
    return app


def register(app: typer.Typer, name: str) -> None:
    """Add the command ``name`` of :data:`LAZY` to ``app`` (importing its module)."""
    module, attribute, group = LAZY[name]
    found = getattr(import_module(module), attribute)
    if group:
        app.add_typer(found, name=name)
    else:
        app.command(name)(found)


def lazy_command(args: Sequence[str]) -> str | None:
    """The :data:`LAZY` command ``args`` run, when nothing before it needs the full app
    (only the root's ``--log-format``); else None."""
    if "_AIGCQ_COMPLETE" in os.environ:  # shell completion lists every command
        return None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] != _VALUED and not args[i].startswith(_VALUED + "="):
            return None  # e.g. ``--help`` first: the root's help lists every command
        i += 2 if args[i] == _VALUED else 1
    return args[i] if i < len(args) and args[i] in LAZY else None


def main() -> None:
    name = lazy_command(sys.argv[1:])
    if name is None:
        from aigcq.cli.app import app
    else:
        app = root()
        register(app, name)
    app()
