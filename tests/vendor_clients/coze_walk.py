"""Coze's own client (``cozepy``) walks the Coze emulator at ``argv[1]``; prints one JSON
object of what it saw. Run by ``tests/integration/test_third_party_sdks.py`` with the
interpreter of ``.venv-cozepy`` (``scripts/vendor-venvs``): cozepy's pins stay out of the
environment the tests run in. Imports nothing of aigcq."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import cozepy

WORKFLOW = "7400000000000000001"


async def walk(base: str) -> dict[str, Any]:
    coze = cozepy.AsyncCoze(auth=cozepy.AsyncTokenAuth("pat_sdk"), base_url=base)
    run = await coze.workflows.runs.create(
        workflow_id=WORKFLOW, parameters={"prompt": "a cat"}, is_async=True
    )
    deadline = time.monotonic() + 10
    while True:
        history = await coze.workflows.runs.run_histories.retrieve(
            workflow_id=WORKFLOW, execute_id=run.execute_id
        )
        if history.execute_status != cozepy.WorkflowExecuteStatus.RUNNING:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"still running after 10 s: {history}")
        await asyncio.sleep(0.05)
    done = await coze.workflows.runs.create(workflow_id=WORKFLOW, parameters={"prompt": "a dog"})
    bad = cozepy.AsyncCoze(auth=cozepy.AsyncTokenAuth("wrong"), base_url=base)
    try:
        await bad.workflows.runs.create(workflow_id=WORKFLOW, parameters={})
        refused = ""
    except cozepy.CozeAPIError as exc:
        refused = type(exc).__name__
    return {
        "executeId": run.execute_id,
        "status": history.execute_status.value,
        "output": history.output,
        "syncData": done.data or "",
        "wrongTokenRaised": refused,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(walk(sys.argv[1]))))
