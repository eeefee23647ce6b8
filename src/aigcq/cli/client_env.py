"""The few settings a client command reads, without pydantic-settings.

A client command given no ``--server`` connects where ``aigcq up`` listens (``AIGCQ_HOST``,
``AIGCQ_WS_PORT``), and an admin command given no token takes the server's (``AIGCQ_ADMIN_TOKEN``,
else ``AIGCQ_DATA_DIR/secrets.json``). Loading :class:`aigcq.config.Settings` for those four
values cost a client command about a second (pydantic-settings and every setting's
validation). This reads them as Settings does: the environment first (any of a setting's
names), then ``./.env``; names case-insensitive; among a setting's names the first one set.
The names and defaults are those of Settings (``tests/unit/test_client_env.py`` checks
that they agree).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: setting -> (its environment names, in Settings' order; its default)
FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "host": (("AIGCQ_HOST",), "127.0.0.1"),
    "ws_port": (("AIGCQ_WS_PORT", "WS_PORT"), "8087"),
    "admin_token": (("AIGCQ_ADMIN_TOKEN",), ""),
    "data_dir": (("AIGCQ_DATA_DIR",), ".aigcq"),
}

#: pydantic's words for it, as ``Settings`` says them
NOT_AN_INTEGER = "Input should be a valid integer, unable to parse string as an integer"
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*$")


class ClientEnvError(ValueError):
    """A setting's value cannot be used (e.g. a port that is not a number)."""


@dataclass(frozen=True, slots=True)
class ClientEnv:
    host: str
    ws_port: int
    admin_token: str
    data_dir: Path

    @property
    def secrets_file(self) -> Path:
        """Where ``aigcq up`` keeps the secrets it generated (``Settings.secrets_file``)."""
        return self.data_dir / "secrets.json"

    def stored_secrets(self) -> dict[str, str]:
        """The contents of :attr:`secrets_file` (empty when there is none)."""
        path = self.secrets_file
        data: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        return data


def read(environ: Mapping[str, str] | None = None, env_file: Path = Path(".env")) -> ClientEnv:
    """The settings from ``environ`` (default: the process's), then ``env_file``."""
    sources = [
        {k.lower(): v for k, v in (os.environ if environ is None else environ).items()},
        {k.lower(): v for k, v in dotenv(env_file).items()},
    ]
    found = {name: _value(sources, names, default) for name, (names, default) in FIELDS.items()}
    values = {name: value for name, (_, value) in found.items()}
    port = values["ws_port"].strip()
    if not (port.isascii() and port.isdigit()):
        raise ClientEnvError(f"{found['ws_port'][0]}: {NOT_AN_INTEGER}")
    return ClientEnv(values["host"], int(port), values["admin_token"], Path(values["data_dir"]))


def _value(sources: list[dict[str, str]], names: tuple[str, ...], default: str) -> tuple[str, str]:
    """(the name, its value): the first of ``names`` set in the first source that sets one
    (as pydantic-settings does: the environment before ``.env``, whichever name)."""
    found = ((n, s[n.lower()]) for s in sources for n in names if n.lower() in s)
    return next(found, (names[0], default))


def dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file (``export`` allowed; ``#`` comments; a value in
    single or double quotes is taken as written inside them), as python-dotenv reads the
    usual forms. A missing file is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is not None:
            found[match[1]] = _unquoted(match[2])
    return found


def _unquoted(raw: str) -> str:
    if raw[:1] in ("'", '"'):
        end = raw.find(raw[0], 1)
        if end > 0:
            inner = raw[1:end]
            return inner.replace('\\"', '"').replace("\\n", "\n") if raw[0] == '"' else inner
    return raw.split(" #", 1)[0].rstrip()
