"""The ``aigcq`` entry point: it builds only the command it is asked to run.

Typer builds every command it has (each one's parameters read from its signature) before
it runs one, and each command's module comes with it: for ``aigcq tasks show X`` most of
that start is spent on commands that do not run. So a command of :data:`LAZY` runs in a
root app that has that command alone (the same root: its options, its help); anything else
(``aigcq --help``, a server command, a mistyped name, shell completion) runs the full app,
:data:`aigcq.cli.app.app`, which registers the same table (:mod:`.command_table`).
"""

import os
import sys
from collections.abc import Sequence

from aigcq.cli.command_table import LAZY, register, root

#: the root's own option that takes a value (``--log-format json``)
_VALUED = "--log-format"


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
