"""Issue 38: the SDK, the bridge, the wire and the emulators each import whole from a fresh
install of their distribution alone: an interpreter that sees only the distribution, the
workspace distributions it depends on and its declared third-party dependencies
(:func:`tests.fakes.distributions.alone`), where the server's libraries are absent."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fakes.distributions import DISTRIBUTIONS, alone, depends_on, isolated, third_party

#: what each may not bring: the server's storage and database libraries, and for the SDK,
#: any server at all, for the bridge any ASGI server (its own is on h11; the emulators
#: serve HTTP with FastAPI)
SERVER_SIDE = {"redis", "hiredis", "psycopg", "psycopg-binary", "psycopg-pool", "aigcq"}
ASGI = {"uvicorn", "fastapi", "starlette"}
FORBIDDEN = {
    "aigcq-client": SERVER_SIDE | ASGI | {"aigcq-asynch"},
    "aigcq-bridge": SERVER_SIDE | ASGI | {"aigcq-asynch"},
    "aigcq-wire": SERVER_SIDE | ASGI | {"websockets", "httpx"},
    "aigcq-emulators": SERVER_SIDE | {"aigcq-asynch"},
}

#: import every module of the distribution (its ``__main__`` modules run, so not those)
IMPORT_ALL = """
import importlib, pathlib, sys
root = pathlib.Path(sys.path[0])
names = sorted(
    ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    for p in (root / "aigcq").rglob("*.py")
    if p.stem != "__main__"
)
for name in names:
    importlib.import_module(name)
absent = ("redis", "psycopg", "aigcq.queue", "aigcq.serve", "aigcq.asynch")
assert not [m for m in absent if importlib.util.find_spec(m) is not None]
print(len(names))
"""


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_a_distribution_brings_none_of_the_server(name: str) -> None:
    brought = third_party(name) | depends_on(name)
    assert not brought & FORBIDDEN[name], sorted(brought & FORBIDDEN[name])


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_a_distribution_imports_whole_alone(name: str, tmp_path: Path) -> None:
    path = alone(name, tmp_path)
    path.insert(0, path.pop(path.index(str(DISTRIBUTIONS[name].root))))  # its own first
    done = subprocess.run(isolated(path, IMPORT_ALL), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) > 0


def test_the_sdk_alone_builds_a_client(tmp_path: Path) -> None:
    """``import aigcq.client`` and a client made, where only aigcq-client is installed."""
    code = """
from aigcq.client import AsyncClient, Client
client = AsyncClient("ws://127.0.0.1:1/", "token", "backend")  # connects when entered
print(type(client).__name__, Client.__name__)
"""
    done = subprocess.run(
        isolated(alone("aigcq-client", tmp_path), code), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["AsyncClient", "Client"]


def test_the_bridge_alone_has_its_command(tmp_path: Path) -> None:
    code = "import runpy; runpy.run_module('aigcq.agent', run_name='__main__', alter_sys=True)"
    cmd = [*isolated(alone("aigcq-bridge", tmp_path), code), "--help"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--comfyui" in done.stdout
