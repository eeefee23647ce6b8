"""The Lua scripts of :mod:`aigcq.queue`: their arguments declared once, by name.

Each script in ``lua/`` starts with a comment block saying what it does; its ``--!`` lines
declare what the loader needs, and nothing else does::

    --! move claim                  a move of domain.TRANSITIONS this script makes
    --! arg now                     an argument, a string (ARGV as Redis passes it)
    --! arg cap:num  (-1: no cap)   a number (``tonumber``)
    --! arg fenced:flag             a flag (true when Python passed a true value)
    --! no move: why                instead of ``move``: the script writes no task state

:func:`load` reads the declaration once per script and builds the source Redis runs: the
shared ``_prelude.lua``, then the lines it generates, then the script's body. The
generated lines make, from the declaration and from :mod:`aigcq.domain`:

* one Lua local per argument, by its name (``local task_id, attempt, cap = ARGV[2],
  ARGV[3], tonumber(ARGV[4])``; ``ARGV[1]`` is always the key prefix, the prelude's ``P``);
* ``FROM[move]``, the comma-separated states each declared move starts from (for the
  prelude's ``allowed``), and ``TO[move]`` for each that leads to one state;
* the task states as constants (``PENDING``, ``RUNNING``, ...): a script names no state
  in a string of its own, so :data:`aigcq.domain.TRANSITIONS` is the only place a move's
  states are written.

In Python, :meth:`Script.argv` turns keyword arguments into that ARGV in the declared
order (worked out once, at load), refusing a missing or an unknown name at call time.
"""

from __future__ import annotations

import functools
import keyword
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from aigcq.domain import TRANSITIONS, Move, TaskState, from_states

Kind = Literal["str", "num", "flag"]

#: how each kind of argument is read from ARGV in Lua
_READ: dict[str, str] = {"str": "{}", "num": "tonumber({})", "flag": "{} == '1'"}

_DECLARATION = re.compile(r"--!\s*(?:(move|arg)\s+(\S+)|(no move):)(.*)$")
_NAME = re.compile(r"[a-z][a-z0-9_]*$")
_PRELUDE_NAME = re.compile(r"^local\s+(?:function\s+)?([A-Za-z_]\w*)", re.MULTILINE)

#: names an argument may not take (besides the prelude's): Lua's keywords and the globals
#: scripts use (the generated names, ``FROM``, ``TO`` and the states, are upper case)
_LUA_RESERVED = frozenset(
    {
        *("and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto"),
        *("if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true"),
        *("until", "while", "redis", "cjson", "cmsgpack", "bit", "struct", "string"),
        *("table", "math", "tonumber", "tostring", "type", "pairs", "ipairs", "next"),
        *("unpack", "select", "error", "pcall", "assert"),
    }
)


class DeclarationError(ValueError):
    """A script's ``--!`` declaration is malformed."""


@dataclass(frozen=True, slots=True)
class Arg:
    name: str
    kind: Kind = "str"


@dataclass(frozen=True, slots=True)
class Script:
    """One script: its declaration, and the source Redis runs."""

    name: str
    args: tuple[Arg, ...]
    #: the moves it makes (empty: it writes no task state, ``no_move`` says why)
    moves: tuple[Move, ...]
    no_move: str
    source: str
    _get: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    _flags: tuple[int, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def argv(self, prefix: str, values: Mapping[str, Any]) -> list[Any]:
        """``[prefix, *values in declared order]``, flags as 1/0. TypeError when
        ``values`` misses a declared name or has one the script does not declare."""
        try:
            out = [prefix, *self._get(values)]
        except KeyError:
            raise self._mismatch(values) from None
        if len(values) != len(self.args):
            raise self._mismatch(values)
        for i in self._flags:
            out[i] = 1 if out[i] else 0
        return out

    def _mismatch(self, values: Mapping[str, Any]) -> TypeError:
        missing = [n for n in self.names if n not in values]
        unknown = sorted(set(values) - set(self.names))
        return TypeError(f"script {self.name}: missing {missing}, unknown {unknown}")


def parse(name: str, text: str) -> tuple[tuple[Arg, ...], tuple[Move, ...], str]:
    """The ``--!`` declaration in ``text``'s leading comment block: (args, moves, the
    reason given for ``no move``)."""
    args: list[Arg] = []
    moves: list[Move] = []
    no_move = ""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("--"):
            break  # the header ends at the first line of code
        if not line.startswith("--!"):
            continue
        m = _DECLARATION.match(line)
        if m is None:
            raise DeclarationError(f"{name}.lua: cannot read {line!r}")
        what, value, rest = m.group(1) or m.group(3), m.group(2), m.group(4).strip()
        if what == "move":
            try:
                moves.append(Move(value))
            except ValueError:
                raise DeclarationError(f"{name}.lua: {value!r} is no domain.Move") from None
        elif what == "arg":
            arg_name, _, kind = value.partition(":")
            if kind not in ("", "str", "num", "flag"):
                raise DeclarationError(f"{name}.lua: {arg_name}: unknown kind {kind!r}")
            args.append(Arg(arg_name, kind or "str"))  # type: ignore[arg-type]
        else:
            no_move = rest or "?"
    if bool(moves) == bool(no_move):
        raise DeclarationError(f"{name}.lua: declare its moves, or 'no move:' and why")
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise DeclarationError(f"{name}.lua: an argument is declared twice: {names}")
    if len(set(moves)) != len(moves):
        raise DeclarationError(f"{name}.lua: a move is declared twice")
    return tuple(args), tuple(moves), no_move


def _check_names(name: str, args: tuple[Arg, ...], taken: frozenset[str]) -> None:
    for a in args:
        if not _NAME.match(a.name) or keyword.iskeyword(a.name):
            raise DeclarationError(f"{name}.lua: {a.name!r} is not a snake_case name")
        if a.name in taken or a.name in _LUA_RESERVED:
            raise DeclarationError(f"{name}.lua: {a.name!r} is taken (prelude, Lua, states)")


def _lua_string(value: str) -> str:
    assert "'" not in value and "\\" not in value
    return f"'{value}'"


def _generated(args: tuple[Arg, ...], moves: tuple[Move, ...]) -> str:
    states = list(TaskState)
    lines = [
        f"local {', '.join(s.name for s in states)} = "
        + ", ".join(_lua_string(s.value) for s in states),
    ]
    src = {m.value: from_states(m) for m in moves}
    dst = {
        m.value: next(iter(TRANSITIONS[m][1])).value for m in moves if len(TRANSITIONS[m][1]) == 1
    }
    lines.append(
        "local FROM = {" + ", ".join(f"{k} = {_lua_string(v)}" for k, v in src.items()) + "}"
    )
    lines.append(
        "local TO = {" + ", ".join(f"{k} = {_lua_string(v)}" for k, v in dst.items()) + "}"
    )
    if args:
        reads = [_READ[a.kind].format(f"ARGV[{i}]") for i, a in enumerate(args, start=2)]
        lines.append(f"local {', '.join(a.name for a in args)} = {', '.join(reads)}")
    return "\n".join(lines)


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    if not names:
        return lambda values: ()
    if len(names) == 1:
        only = names[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*names)


def _read(file: str) -> str:
    return (resources.files("aigcq.queue") / "lua" / file).read_text()


@functools.cache
def _prelude() -> tuple[str, frozenset[str]]:
    text = _read("_prelude.lua")
    return text, frozenset(_PRELUDE_NAME.findall(text)) | {s.name for s in TaskState}


@functools.cache
def load(name: str) -> Script:
    """Script ``name`` (``lua/<name>.lua``), its declaration read and its source built."""
    prelude, taken = _prelude()
    body = _read(f"{name}.lua")
    args, moves, no_move = parse(name, body)
    _check_names(name, args, taken)
    source = "\n".join((prelude, _generated(args, moves), body))
    names = tuple(a.name for a in args)
    flags = tuple(i for i, a in enumerate(args, start=1) if a.kind == "flag")
    return Script(name, args, moves, no_move, source, _getter(names), flags)
