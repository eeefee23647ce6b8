"""A bridge WebSocket that never sends REGISTER is closed after
``AIGCQ_BRIDGE_REGISTER_TIMEOUT_S`` with 4408 (issue 25 item 9): no socket is held by a
peer that never says who it is. Other frames do not extend the wait; a REGISTER in time
keeps the connection."""

from __future__ import annotations

import pytest

from tests.fakes.service import Env, env

__all__ = ["env"]  # a fixture: imported for pytest to find


@pytest.fixture
def quick(env: Env) -> Env:
    env.service.rt.settings.bridge_register_timeout_s = 0.3
    return env


async def test_a_silent_bridge_is_closed_with_4408(quick: Env) -> None:
    bridge = await quick.bridge()
    error = await bridge.next()
    assert error["type"] == "ERROR" and error["data"]["code"] == "RegisterTimeout"
    assert "AIGCQ_BRIDGE_REGISTER_TIMEOUT_S" in error["data"]["msg"]
    assert await bridge.close_code() == 4408


async def test_frames_other_than_register_do_not_extend_the_wait(quick: Env) -> None:
    bridge = await quick.bridge()
    await bridge.send("HEARTBEAT", {"instanceCount": 1, "availableInstanceCount": 1})
    assert (await bridge.next())["data"]["code"] == "NotRegistered"
    assert (await bridge.next())["data"]["code"] == "RegisterTimeout"
    assert await bridge.close_code() == 4408


async def test_a_bridge_that_registers_in_time_stays(quick: Env) -> None:
    bridge = await quick.bridge()
    await bridge.register(count=1)
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=1.0)  # nothing: no ERROR, no close
    await bridge.send("PONG")
