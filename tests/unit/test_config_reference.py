"""docs/configuration.md is what scripts/gen_config_reference.py generates (never stale)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_config_reference.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_matches_the_settings_classes() -> None:
    gen = load_generator()
    committed = gen.OUTPUT.read_text()
    assert committed == gen.render(), "stale: run scripts/gen_config_reference.py"


def test_reference_lists_seed_aliases_and_prefixed_names() -> None:
    text = load_generator().render()
    assert "| `redis_url` | `AIGCQ_REDIS_URL` `REDIS_URL` |" in text
    assert "`AIGCQ_ASYNCH_WORKER_ENABLED`" in text and "`AIGCQ_BRIDGE_SERVER`" in text
    assert "`AIGCQ_OVERFLOW_PRICE`" in text
