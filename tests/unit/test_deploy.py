"""deploy/: syntax checks for what cannot run here (Docker, compose, systemd, Grafana)."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path
from typing import Any

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
        assert parser["Service"]["ExecStart"].startswith("/opt/aigcq/bin/aigcq "), unit.name
        assert parser["Service"]["User"] == "aigcq"


def test_grafana_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "aigcq.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    modules = ("observability/metrics.py", "serve/metrics.py", "asynch/metrics.py")
    sources = "".join((SRC / m).read_text() for m in modules)
    for name in {n for e in exprs for n in re.findall(r"aigcq_\w+", e)}:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert f'"{base}"' in sources or f'"{base.removesuffix("_total")}"' in sources, name
