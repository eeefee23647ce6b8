"""Every parameter of every ``aigcq`` command is read without pydantic
(:mod:`aigcq.cli.plain_params`), and where that read is sure, its value is the one typer's
own adapter gives (issue 29 item 6: a client command starts without pydantic)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer import _click
from typer._coercion import build_runtime_param

from aigcq.cli.app import app
from aigcq.cli.plain_params import NOT_PLAIN, plain_read

SAMPLES = ["5", "-3", "2.5", "1e3", " 7", "+4", "abc", "", "text", "JSON", "json", "/tmp/x", "-"]


def parameters(command: Any) -> Iterator[tuple[Any, Any]]:
    """(command, parameter) of ``command`` and every command under it."""
    for param in command.params:
        yield command, param
    for sub in getattr(command, "commands", {}).values():
        yield from parameters(sub)


ALL = list(parameters(typer.main.get_command(app)))


def test_every_parameter_is_plain() -> None:
    """None falls back to typer's adapter (which would import pydantic at every start)."""
    assert ALL
    for command, param in ALL:
        assert plain_read(param.type_descriptor) is not None, (command.name, param.name)


def typer_reads(param: Any, value: Any, ctx: Any) -> Any:
    try:
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)
    except (_click.exceptions.ClickException, ValueError) as exc:
        return type(exc)


def test_a_sure_read_is_the_adapters() -> None:
    for command, param in ALL:
        read = plain_read(param.type_descriptor)
        assert read is not None
        ctx = _click.Context(command)
        values: list[Any] = [*SAMPLES, list(SAMPLES[:2])]
        if param.default is not None:
            values.append(param.default)
        for value in values:
            if isinstance(value, list) and not (param.multiple or param.nargs == -1):
                continue
            ours = read(value, param, ctx)
            if ours is not NOT_PLAIN:
                theirs = typer_reads(param, value, ctx)
                same = ours == theirs and type(ours) is type(theirs)
                assert same, (command.name, param.name, value, ours, theirs)
