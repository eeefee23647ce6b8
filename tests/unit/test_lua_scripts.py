"""The queue's Lua scripts declare their arguments once, by name, and Python passes exactly
those (aigcq.queue.scripts)."""

from __future__ import annotations

import ast
import inspect
from importlib import resources

import pytest

from aigcq.queue import reads, scripts, store
from aigcq.queue.scripts import Arg, DeclarationError, parse
from aigcq.queue.store import SCRIPTS

LUA = resources.files("aigcq.queue") / "lua"


def test_every_script_file_is_loaded() -> None:
    files = {p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua")}
    assert files - {"_prelude"} == set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_declaration_parses_into_lua_locals(name: str) -> None:
    script = scripts.load(name)
    assert script.args, name
    line = f"local {', '.join(script.names)} = "
    assert line in script.source
    assert "ARGV[" not in _body(name), f"{name} reads ARGV by position"


def _body(name: str) -> str:
    text = (LUA / f"{name}.lua").read_text()
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def _run_calls() -> dict[str, list[set[str]]]:
    """Every ``self._run("<script>", name=...)`` in the store and its reads: the names it
    passes."""
    calls: dict[str, list[set[str]]] = {}
    source = inspect.getsource(store) + "\n" + inspect.getsource(reads)
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "_run"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            continue
        assert len(node.args) == 1, "arguments are passed by name"
        names = {k.arg for k in node.keywords}
        assert None not in names, "no **spread: every name is written at the call"
        calls.setdefault(node.args[0].value, []).append({n for n in names if n})
    return calls


def test_what_python_passes_is_what_each_script_declares() -> None:
    calls = _run_calls()
    assert set(calls) == set(SCRIPTS)
    for name, passed in calls.items():
        declared = set(scripts.load(name).names)
        for names in passed:
            assert names == declared, (name, names ^ declared)


def test_argv_is_in_declared_order_with_flags_as_numbers() -> None:
    script = scripts.load("requeue")
    values = {n: n for n in script.names} | {"unsent_only": True, "uncharge": 0, "ended": "x"}
    argv = script.argv("pfx", values)
    assert argv[0] == "pfx" and len(argv) == len(script.names) + 1
    by_name = dict(zip(script.names, argv[1:], strict=True))
    assert by_name["task_id"] == "task_id" and by_name["move"] == "move"
    assert (by_name["unsent_only"], by_name["uncharge"], by_name["ended"]) == (1, 0, 1)


def test_a_missing_or_unknown_name_is_refused_at_call_time() -> None:
    script = scripts.load("release_orphan")
    late = {"late_class": "UncertainSubmit", "minid": 0, "cost": ""}
    given = {"remote_id": "r", "result_json": "", "now": 1, **late}
    assert script.argv("p", given) == ["p", "r", "", 1, "UncertainSubmit", 0, ""]
    with pytest.raises(
        TypeError,
        match=r"missing \['remote_id', 'result_json', 'now', 'late_class', 'minid', 'cost'\]",
    ):
        script.argv("p", {})
    with pytest.raises(TypeError, match=r"unknown \['extra'\]"):
        script.argv("p", {**given, "extra": 1})
    with pytest.raises(TypeError, match=r"missing \['remote_id'\], unknown \['remote'\]"):
        script.argv("p", {"remote": "r", "result_json": "", "now": 1, **late})


def test_a_declaration_reads_kinds_moves_and_the_reason_for_none() -> None:
    text = "-- what it does\n--! move claim\n--! arg n:num  at most\n--! arg on:flag\nlocal x = 1\n"
    args, moves, why = parse("x", text)
    assert args == (Arg("n", "num"), Arg("on", "flag")) and [m.value for m in moves] == ["claim"]
    assert why == ""
    args, moves, why = parse("y", "--! no move: it writes no task\n--! arg a\n")
    assert (args, moves, why) == ((Arg("a"),), (), "it writes no task")
    # a --! line after the header's end is body, not declaration
    assert parse("z", "--! move claim\nlocal a = 1\n--! arg b\n")[0] == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("--! arg a\n", "declare its moves"),
        ("--! move claim\n--! no move: both\n", "declare its moves"),
        ("--! move nothing\n", "no domain.Move"),
        ("--! move claim\n--! arg a:int\n", "unknown kind"),
        ("--! move claim\n--! arg a\n--! arg a\n", "declared twice"),
        ("--! move claim\n--! move claim\n", "declared twice"),
        ("--! move claim\n--! args a\n", "cannot read"),
    ],
)
def test_a_malformed_declaration_is_refused(text: str, problem: str) -> None:
    with pytest.raises(DeclarationError, match=problem):
        parse("bad", text)


@pytest.mark.parametrize("name", ["note", "orphan", "P", "end", "error", "taskId", "from"])
def test_an_argument_may_not_shadow_the_prelude_lua_or_python(name: str) -> None:
    _, taken = scripts._prelude()
    with pytest.raises(DeclarationError):
        scripts._check_names("bad", (Arg(name),), taken)
