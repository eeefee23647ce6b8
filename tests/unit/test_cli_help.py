"""Every ``aigcq ... --help``: no type placeholders, every option and argument explained,
no reference a reader of this repository cannot follow ("seed 000")."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from aigcq.cli.app import app


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's path (typer vendors its own click: duck-typed)."""
    yield path
    for name, sub in getattr(group, "commands", {}).items():
        yield from commands(sub, (*path, name))


def all_commands() -> list[tuple[str, ...]]:
    return list(commands(typer.main.get_command(app)))


def test_help_has_no_type_placeholders_nor_seed_references() -> None:
    for path in all_commands():
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        assert not re.search(r"<(bool|str|int|float|path|list\[str\])>", text), (path, text)
        assert not re.search(r"seed \d{3}", text), (path, text)
        assert "[default: 0]" not in text and "{" not in text.split("\n", 2)[1], (path, text)


def test_every_option_and_argument_is_explained() -> None:
    root = typer.main.get_command(app)
    for path in all_commands():
        command = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            helped = getattr(param, "help", None)
            assert helped, (path, param.name)
