"""``aigcq token`` signs with the server's secret or refuses, naming where it looked."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest
from typer.testing import CliRunner

from aigcq.cli.app import app
from tests.fakes.cli import one_error_line


@pytest.fixture(autouse=True)
def elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("TOKEN_SECRET", "AIGCQ_TOKEN_SECRET", "AIGCQ_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_outside_a_servers_folder_refuses_and_creates_nothing(tmp_path: Path) -> None:
    line = one_error_line(CliRunner().invoke(app, ["token", "me"]), 2)
    where = tmp_path / ".aigcq" / "secrets.json"
    assert line == (
        f"error: no server secret here: TOKEN_SECRET is unset (environment, ./.env) and "
        f"{where} has none; run this where `aigcq up` runs"
    )
    assert not (tmp_path / ".aigcq").exists()


def test_in_a_servers_folder_signs_with_its_secret(tmp_path: Path) -> None:
    secret = "s" * 32
    (tmp_path / ".aigcq").mkdir()
    (tmp_path / ".aigcq" / "secrets.json").write_text(json.dumps({"token_secret": secret}))
    result = CliRunner().invoke(app, ["token", "me"])
    assert result.exit_code == 0, result.output
    assert jwt.decode(result.stdout.strip(), secret, algorithms=["HS256"])["sub"] == "me"


def test_repeated_id_options_name_every_id_the_token_may_use(tmp_path: Path) -> None:
    secret = "s" * 32
    (tmp_path / ".aigcq").mkdir()
    (tmp_path / ".aigcq" / "secrets.json").write_text(json.dumps({"token_secret": secret}))
    args = ["token", "acme", "--id", "acme-cn", "--id", "acme-eu", "--id", "acme"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    claims = jwt.decode(result.stdout.strip(), secret, algorithms=["HS256"])
    assert (claims["sub"], claims["ids"]) == ("acme", ["acme", "acme-cn", "acme-eu"])
