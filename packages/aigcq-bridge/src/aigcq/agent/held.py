"""Prompts this bridge submitted and has not finished, kept across its restarts.

Written to ``<data dir>/held/<taskId>.json`` just before the prompt goes to ComfyUI, removed
once the task's TASK_END is spooled (or the hub cancelled it). A restarted bridge finds each
one again on its instance (the prompt id is the task id) and follows it to its end instead of
running it again (one the instance never received is lost: a machine's failure, retried
elsewhere); REGISTER lists them, so aigcq keeps them on this bridge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aigcq.agent.spool import JsonFiles
from aigcq.wire.bridge import TaskAssignData


@dataclass(frozen=True, slots=True)
class HeldPrompt:
    assign: TaskAssignData
    prompt_id: str
    instance_url: str
    #: when the task started here (epoch s): a re-adopted task's taskCostTime counts from it
    started_at: float = field(default_factory=time.time)

    @property
    def task_id(self) -> str:
        return self.assign.task_id or self.prompt_id


class HeldPrompts(JsonFiles):
    async def put(self, held: HeldPrompt) -> None:
        data: dict[str, Any] = {
            "assign": held.assign.model_dump(mode="json"),
            "promptId": held.prompt_id,
            "instanceUrl": held.instance_url,
            "startedAt": held.started_at,
        }
        await self.save(held.task_id, data)

    def load_all(self) -> list[HeldPrompt]:
        return self.read_all(
            lambda data: HeldPrompt(
                TaskAssignData.model_validate(data["assign"]),
                str(data["promptId"]),
                str(data["instanceUrl"]),
                float(data.get("startedAt") or time.time()),  # older files: from now
            )
        )
