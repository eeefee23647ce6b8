"""Redis keys of the asynch service.

* ``asynch:runtime:max_concurrency:{model}`` / ``asynch:runtime:queue_limit:{model}`` —
  autoTune's runtime limits (TTL), preferred over the configured caps but never above them.
* ``asynch:gate:{model}`` — ZSET task_id → time taken: the queue-limit gate.
* ``asynch:sem:{model}:{tenant}`` — ZSET task_id → lease expiry: the concurrency semaphore.
"""

from __future__ import annotations

PREFIX = "asynch:"


def runtime_max_concurrency_key(model: str) -> str:
    return f"{PREFIX}runtime:max_concurrency:{model}"


def runtime_queue_limit_key(model: str) -> str:
    return f"{PREFIX}runtime:queue_limit:{model}"


def gate_key(model: str) -> str:
    return f"{PREFIX}gate:{model}"


def semaphore_key(model: str, tenant: str) -> str:
    return f"{PREFIX}sem:{model}:{tenant}"


# Shared Lua: the effective limit is the runtime value when set, capped by the configured one.
EFFECTIVE_LIMIT = """
local function effective_limit(runtime_key, cap)
  local runtime = tonumber(redis.call('GET', runtime_key))
  if runtime and runtime >= 1 and runtime < cap then return runtime end
  return cap
end
"""
