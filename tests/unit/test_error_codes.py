"""Every client error code has a Chinese default message that code.json can override, and
the protocol docs list every code the servers send."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aigcq.config import PlatformConfig
from aigcq.domain import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
NEW_DEFAULTS = {
    "TaskNotFound": "任务不存在。",
    "TaskGone": "任务已结束。",
    "SignatureError": "签名校验失败。",
    "TaskNotRetryable": "只有失败或已取消的任务可以重试。",
    "BridgeNotFound": "桥接节点不存在。",
    "NoCapableInstance": "暂无可运行该任务的计算节点，请稍后再试。",
}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_has_a_chinese_default_sentence(tmp_path: Path, code: ErrorCode) -> None:
    message = PlatformConfig.load(tmp_path).messages.get(code.value)
    assert message != code.value and message.endswith("。")
    assert re.search(r"[\u4e00-\u9fff]", message)


@pytest.mark.parametrize(("code", "default"), NEW_DEFAULTS.items())
def test_new_defaults_and_their_code_json_overrides(
    tmp_path: Path, code: str, default: str
) -> None:
    assert PlatformConfig.load(tmp_path).messages.get(code) == default
    (tmp_path / "code.json").write_text(f'{{"ERROR": {{"{code}": "custom"}}}}')
    assert PlatformConfig.load(tmp_path).messages.get(code) == "custom"


def test_client_protocol_lists_every_error_code_with_its_status() -> None:
    doc = (ROOT / "docs/client-protocol.md").read_text()
    for code in ErrorCode:
        assert f"`{code.value}`" in doc, code
    assert "| `TaskNotRetryable` |" in doc and "| `SignatureError` |" in doc


def test_bridge_protocol_lists_every_error_code_the_hub_sends() -> None:
    bridges = ROOT / "src/aigcq/bridges"
    wire = ROOT / "packages/aigcq-wire/src/aigcq/wire/bridge.py"  # ProtocolError's codes
    sources = "".join(path.read_text() for path in [*bridges.glob("*.py"), wire])
    sent = set(re.findall(r'(?:session\.error\(|ProtocolError\()"(\w+)"', sources))
    assert {"NotRegistered", "JSONError"} <= sent
    doc = (ROOT / "docs/bridge-protocol.md").read_text()
    missing = {code for code in sent if f"`{code}`" not in doc}
    assert not missing, f"codes the hub sends but docs/bridge-protocol.md does not list: {missing}"
