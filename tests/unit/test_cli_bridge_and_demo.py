"""The bridge token need not be on the command line (where `ps` shows it); the demo's helpers
listen where they are told; the demo's banner links the dashboard and names the secrets file."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from aigcq.agent.cli import read_token_file
from aigcq.cli.app import app
from tests.fakes.cli import one_error_line


def test_a_token_file_is_read_without_its_newline(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("bridge-secret\n")
    assert read_token_file(tmp_path / "token") == "bridge-secret"


def test_an_unreadable_token_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = CliRunner().invoke(app, ["bridge", "--token-file", str(missing)])
    assert one_error_line(result, 2) == (
        f"error: cannot read the token file {missing}: No such file or directory"
    )


def test_the_demo_hands_its_bridge_the_token_by_environment(tmp_path: Path) -> None:
    from aigcq.cli.demo import Demo, DemoOptions
    from aigcq.config import Settings

    settings = Settings(data_dir=tmp_path, bridge_token="demo-bridge-secret")
    child = Demo.plan(settings, DemoOptions()).bridge()
    assert "demo-bridge-secret" not in " ".join(child.args)
    assert child.env == {"AIGCQ_BRIDGE_TOKEN": "demo-bridge-secret"}


def test_the_demo_helpers_take_the_ports_they_are_given(tmp_path: Path) -> None:
    from aigcq.cli.demo import Demo, DemoOptions
    from aigcq.config import Settings

    options = DemoOptions(runninghub_port=19101, comfyui_port=19188, bridge_port=19190)
    demo = Demo.plan(Settings(data_dir=tmp_path), options)
    assert demo.runninghub == "http://127.0.0.1:19101"
    assert demo.comfyui == ["http://127.0.0.1:19188", "http://127.0.0.1:19189"]
    assert demo.bridge_port == 19190


@pytest.mark.parametrize("terminal", [True, False])
def test_the_demo_banner_links_the_dashboard_and_names_the_secrets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    """The link the dashboard's own hint sends a newcomer to (issue 29 item 4), with the
    admin token on a terminal only: nowhere else may a secret go (issue 42 item 13)."""
    from aigcq.cli.demo import Demo, DemoOptions
    from aigcq.config import Settings
    from aigcq.serve.launch import ensure_secrets

    settings = Settings(data_dir=tmp_path, ws_port=18087)
    ensure_secrets(settings)  # as the demo does: generated into <data dir>/secrets.json
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    out = io.StringIO()
    Demo.plan(settings, DemoOptions()).banner(Console(file=out, width=300))
    banner = out.getvalue()
    link = "http://127.0.0.1:18087/dashboard"
    shown = f"{link}#token={settings.admin_token}\n" if terminal else f"{link} (its admin token"
    assert f"  dashboard   {shown}" in banner, banner
    assert terminal == (settings.admin_token in banner), banner
    secrets = tmp_path.resolve() / "secrets.json"
    assert f"  secrets     {secrets} (token secret, admin and bridge tokens)\n" in banner, banner
