"""deploy/: syntax checks for what cannot run here (Docker, compose, systemd, Grafana)."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SRC = DEPLOY.parent / "src" / "aigcq"

DOCKERFILE_KEYWORDS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(keyword, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0], ln.split(None, 1)[1]) for ln in joined.splitlines()]


def test_dockerfile_is_well_formed() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert {kw for kw, _ in instructions} <= DOCKERFILE_KEYWORDS
    user = [args for kw, args in instructions if kw == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert ("CMD", '["serve"]') in instructions and ("ENTRYPOINT", '["aigcq"]') in instructions
    assert any(kw == "RUN" and "pip install ." in args for kw, args in instructions)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def test_compose_has_every_service_and_durable_redis() -> None:
    services = compose()["services"]
    assert set(services) >= {"redis", "postgres", "serve", "dispatcher", "bridge", "asynch"}
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd and "--appendfsync everysec" in redis_cmd
    for name in ("serve", "dispatcher", "bridge", "asynch"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert services[name]["env_file"] == ["aigcq.env"]
    assert services["serve"]["command"] == ["serve"]


def test_compose_keeps_serves_data_and_publishes_no_open_metrics() -> None:
    services = compose()["services"]
    assert any(v.endswith(":/var/lib/aigcq") for v in services["serve"]["volumes"])
    for name in ("serve", "dispatcher", "asynch"):  # each serves /metrics on a published port
        assert services[name]["ports"], name
        token = services[name]["environment"]["AIGCQ_METRICS_TOKEN"]
        assert token.startswith("${AIGCQ_METRICS_TOKEN:?"), name
    example = (DEPLOY / "aigcq.env.example").read_text()
    assert re.search(r"^AIGCQ_METRICS_TOKEN=$", example, re.M)


def test_compose_has_no_default_passwords() -> None:
    """Secrets are required substitutions (``${X:?...}``) or come from the env file."""
    text = (DEPLOY / "compose.yaml").read_text()
    assert "${" in text and not re.search(r"\$\{\w+:?-", text)  # no ${X:-default}
    for service in compose()["services"].values():
        for key, value in (service.get("environment") or {}).items():
            if re.search("PASSWORD|SECRET|TOKEN", key):
                assert str(value).startswith("${") and ":?" in str(value), key
    example = (DEPLOY / "aigcq.env.example").read_text()
    secrets = ("REDIS_PASSWORD", "POSTGRES_PASSWORD", "AIGCQ_TOKEN_SECRET", "MD_PASSWORD",
               "AIGCQ_ASYNCH_ADMIN_TOKEN")  # fmt: skip
    for secret in secrets:
        assert re.search(rf"^{secret}=$", example, re.M), f"{secret} must be empty"


def test_systemd_units_parse() -> None:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} >= {
        "aigcq-serve@.service", "aigcq-dispatcher.service", "aigcq-bridge.service",
        "aigcq-asynch.service",
    }  # fmt: skip
    for unit in units:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        parser.read_string(unit.read_text())
        assert set(parser.sections()) == {"Unit", "Service", "Install"}, unit.name
        command = parser["Service"]["ExecStart"].split()[0]
        assert command in {"/opt/aigcq/bin/aigcq", "/opt/aigcq/bin/aigcq-bridge"}, unit.name
        assert parser["Service"]["User"] == "aigcq"


def hardening(unit: Path) -> list[str]:
    """The unit's sandboxing lines, from its "# Hardening" comment to [Install]."""
    block = unit.read_text().split("# Hardening", 1)[1].split("[Install]", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_systemd_units_install_from_a_checkout_and_share_their_hardening() -> None:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    for unit in units:
        text = unit.read_text()
        assert "pip install aigcq" not in text, unit.name  # not published
        assert "Documentation=" not in text, unit.name  # the docs are not installed
        assert "ProtectSystem=strict" in hardening(unit), unit.name
    assert all(hardening(u) == hardening(units[0]) for u in units)


def test_systemd_units_score_under_two() -> None:
    """``systemd-analyze security``: 8.5 ("EXPOSED") before the hardening, 1.5 now."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze (Debian's systemd)")
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        done = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", str(unit)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        score = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
        assert score, done.stdout + done.stderr
        assert float(score.group(1)) < 2.0, (unit.name, done.stdout[-3000:])


def test_grafana_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "aigcq.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    modules = ("observability/metrics.py", "serve/metrics.py", "asynch/metrics.py")
    roots = (SRC, DEPLOY.parent / "packages" / "aigcq-asynch" / "src" / "aigcq")
    sources = "".join((r / m).read_text() for m in modules for r in roots if (r / m).exists())
    for name in {n for e in exprs for n in re.findall(r"aigcq_\w+", e)}:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert f'"{base}"' in sources or f'"{base.removesuffix("_total")}"' in sources, name
