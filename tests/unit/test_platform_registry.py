"""The platform registry is complete and consistent: every spec's adapter can be built, every
paid one reports a cost and has an emulator ``aigcq emulate`` can start, and the settings
that name platforms (the seed's and model.json's shapes) agree with the specs. A platform
added by its spec alone is picked up by serve, the CLI and the scheduler (CONTRIBUTING's
recipe, done)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, get_args

import pytest
import typer

from aigcq.cli.common import unknown_platform
from aigcq.cli.emulate import emulate_app
from aigcq.config import ACCOUNT_MODELS, PlatformAccount, PlatformConfig, PlatformKinds, Settings
from aigcq.delivery.custody import keeps_results_of
from aigcq.domain import Task
from aigcq.platforms import base, registry
from aigcq.platforms.registry import CostField, PlatformSpec, specs
from aigcq.queue.store import workflow_of
from aigcq.serve.server import build_adapters

SPECS = specs()


def test_names_are_unique_and_a_second_registration_is_refused() -> None:
    names = [s.name for s in SPECS]
    assert len(names) == len(set(names)) == 5
    with pytest.raises(ValueError, match="registered already"):
        registry.register(SPECS[0])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_adapter_implements_the_interface(spec: PlatformSpec) -> None:
    assert not inspect.isabstract(spec.adapter)
    assert spec.kind in get_args(base.Kind)
    adapter = spec.build(Settings(platform_urls={spec.name: "http://x.test"}))
    assert adapter.base_url == "http://x.test"
    if spec.kind == "callback":  # a callback platform parses its webhook bodies
        assert spec.adapter.parse_result is not base.PlatformAdapter.parse_result


@pytest.mark.parametrize("spec", [s for s in SPECS if s.paid], ids=lambda s: s.name)
def test_every_paid_platform_reports_a_cost_and_has_an_emulator(spec: PlatformSpec) -> None:
    assert spec.cost and set(spec.cost) <= set(get_args(CostField))
    assert set(get_args(CostField)) == {f.name for f in dataclasses.fields(base.Cost)}
    commands = typer.main.get_command(emulate_app).commands
    assert spec.emulator in commands, f"no `aigcq emulate {spec.emulator}`"
    emulator = importlib.import_module(f"aigcq.emulators.{spec.emulator.replace('-', '_')}")
    assert callable(emulator.run)


def test_the_settings_that_name_platforms_agree_with_the_specs() -> None:
    fields = Settings.model_fields
    for spec in SPECS:
        setting = fields.get(f"{spec.name}_url")
        assert setting is None or setting.default == spec.url, spec.name
        assert spec.base_url(Settings()) == spec.url
    own = [s for s in SPECS if s.account is not PlatformAccount]
    own_accounts = {p: s.account for s in own for p in s.adapter.serves}
    assert own_accounts == ACCOUNT_MODELS
    kind_of = {p: s.kind for s in SPECS if not s.adapter.opt_in for p in s.adapter.serves}
    kinds = PlatformKinds()  # the seed's Platform.json: what it lists, it lists right
    assert all(kind_of[p] == "polling" for p in kinds.polling)
    assert all(kind_of.get(p, "callback") == "callback" for p in kinds.callback)
    kept = [s.name for s in SPECS if keeps_results_of(Settings(), s.name)]
    assert kept == ["runninghub", "jimuai", "comfy_v2"]  # the former default list


# ---- the recipe, done: a platform added by its module alone -------------------------------


class _FakeAdapter(base.PlatformAdapter):
    name = "fakeplat"
    kind = "polling"
    serves = ("fakeplat",)

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> base.HttpRequest:
        return base.HttpRequest("POST", f"{self.base_url}/run", json=task.payload)

    def parse_submit(self, status: int, body: Any) -> base.SubmitOutcome:
        return base.Accepted(str(body["id"]))

    def query_request(self, task: Task, apikey: str) -> base.HttpRequest:
        return base.HttpRequest("GET", f"{self.base_url}/runs/{task.remote_id}")

    def parse_query(self, status: int, body: Any) -> base.ResultOutcome:
        return base.Succeeded(body)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> PlatformSpec:
    spec = PlatformSpec(
        _FakeAdapter,
        url="https://fake.test",
        workflow_field="fake_model",
        cost=("units",),
        expiring_links=True,
    )
    monkeypatch.setattr(registry, "_SPECS", {**registry._SPECS})
    return registry.register(spec)


def test_a_new_platform_needs_no_other_module(fake: PlatformSpec, tmp_path: Any) -> None:
    adapters = build_adapters(Settings())
    assert adapters["fakeplat"].base_url == "https://fake.test" and adapters["fakeplat"].paid
    moved = Settings(platform_urls={"fakeplat": "http://127.0.0.1:9"})
    assert build_adapters(moved)["fakeplat"].base_url == "http://127.0.0.1:9"
    (tmp_path / "model.json").write_text('{"p": {"fakeplat": {"apikey": "k"}}}')
    assert unknown_platform(PlatformConfig.load(tmp_path)) == ""
    assert workflow_of({"fake_model": "m1"}) == "m1"
    assert keeps_results_of(Settings(), "fakeplat")
