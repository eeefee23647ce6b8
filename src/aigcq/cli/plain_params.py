"""Command-line values read without pydantic, where typer would build one for each.

Typer (0.2x) coerces every parameter's value through a pydantic ``TypeAdapter`` built for
it at run time: the root's ``--log-format`` alone made each client command import pydantic
and build its schemas, a tenth of a second or more of every start. The parameters of
aigcq's commands are plain (``str``, ``int``, ``float``, ``bool``, ``Path``, an ``Enum``,
lists and optionals of them): here such a value is read directly when it is a plain form whose
reading is certain (a ``str``, ASCII digits for an ``int``, a decimal for a ``float``, a
choice or a path read by typer's own functions), and anything else (another form, a value
out of ``min``/``max``, a parser, a type not listed) goes to typer's own adapter, which
then reads it, or refuses it with its usual message. Applied once, when the root app is
made (:func:`aigcq.cli.entry.root`).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from typer import core
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_choice, coerce_cli_path

#: a read of one value: its result, or :data:`NOT_PLAIN` for typer's adapter to decide
Read = Callable[[Any, Any, Any], Any]
NOT_PLAIN: Any = object()

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


@dataclass(frozen=True)
class PlainParam(RuntimeParam):
    """A parameter read by ``read``, or by typer's adapter when ``read`` is not sure."""

    read: Read
    descriptor: TypeDescriptor

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        got = self.read(value, param, ctx)
        if got is NOT_PLAIN:
            return build_runtime_param(self.descriptor)._coerce_value(value, param, ctx)
        return got


def _str(value: Any, param: Any, ctx: Any) -> Any:
    return value if isinstance(value, str) else NOT_PLAIN


def _bool(value: Any, param: Any, ctx: Any) -> Any:
    return value if isinstance(value, bool) else NOT_PLAIN


def _number(kind: type[int] | type[float], low: Any, high: Any) -> Read:
    pattern = _INT if kind is int else _FLOAT

    def read(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value.isascii() and pattern.fullmatch(value):
            number: Any = kind(value)
        elif type(value) is kind or (kind is float and type(value) is int):
            number = kind(value)
        else:
            return NOT_PLAIN
        in_range = (low is None or number >= low) and (high is None or number <= high)
        return number if in_range else NOT_PLAIN

    return read


def _choice(choices: list[Any], case_sensitive: bool) -> Read:
    def read(value: Any, param: Any, ctx: Any) -> Any:
        try:
            return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)
        except ValueError:  # not a choice: refused by typer's adapter, with its message
            return NOT_PLAIN

    return read


def _path(descriptor: TypeDescriptor, path_type: type[Any]) -> Read:
    info = descriptor.parameter_info

    def read(value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str | Path):
            return NOT_PLAIN
        return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)

    return read


def _list(item: Read) -> Read:
    def read(value: Any, param: Any, ctx: Any) -> Any:
        items = value if isinstance(value, list | tuple) else [value]
        got = [item(v, param, ctx) for v in items]
        return NOT_PLAIN if any(g is NOT_PLAIN for g in got) else got

    return read


def _unoptional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        kept = [a for a in get_args(annotation) if a is not type(None)]
        return kept[0] if len(kept) == 1 else None
    return annotation


def plain_read(descriptor: TypeDescriptor) -> Read | None:
    """How to read a parameter of ``descriptor`` without pydantic (None: typer's way)."""
    info = descriptor.parameter_info
    if descriptor.file_annotation is not None or info.parser is not None:
        return None
    if getattr(info, "clamp", False) or getattr(info, "click_type", None) is not None:
        return None
    annotation = _unoptional(descriptor.annotation)
    if get_origin(annotation) is list:
        (inner,) = get_args(annotation) or (None,)
        item = _leaf(descriptor, _unoptional(inner))
        return None if item is None else _list(item)
    return _leaf(descriptor, annotation)


def _leaf(descriptor: TypeDescriptor, annotation: Any) -> Read | None:
    info = descriptor.parameter_info
    path_options = info.allow_dash or info.path_type is not None or info.resolve_path
    if annotation is str and not path_options:
        return _str
    if annotation is bool:
        return _bool
    if annotation in (int, float):
        return _number(annotation, info.min, info.max)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _choice(list(annotation), info.case_sensitive)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return _path(descriptor, info.path_type or annotation)
    return None


_typer_runtime_param = core._TyperParameter.get_runtime_param


def _runtime_param(self: core._TyperParameter) -> RuntimeParam:
    if self._runtime_param is None:
        descriptor = self.type_descriptor
        read = plain_read(descriptor)
        if read is not None:
            self._runtime_param = PlainParam(
                descriptor.parameter_info, descriptor.annotation, read, descriptor
            )
    return _typer_runtime_param(self)


def apply() -> None:
    core._TyperParameter.get_runtime_param = _runtime_param  # type: ignore[method-assign]
