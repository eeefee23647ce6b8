"""The shared parts of one aigcq process, built once and handed to every component."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from aigcq.config import PlatformAccount, PlatformConfig, Settings
from aigcq.delivery.custody import keeps_results_of
from aigcq.platforms.client import PlatformClient
from aigcq.plumbing.signing import webhook_url
from aigcq.queue.store import TaskStore

#: the longest a task runs on a paid platform not listed in ``AIGCQ_PAID_MAX_RUN_S``
DEFAULT_MAX_RUN_S = 3600.0


@dataclass
class Runtime:
    settings: Settings
    config: PlatformConfig
    redis: Redis
    store: TaskStore
    platforms: PlatformClient
    #: the wall clock spend periods and budgets are read by (a test moves it to a new day)
    clock: Callable[[], float] = field(default=time.time)

    def deadline_s(self, account: PlatformAccount | None) -> float:
        if account is not None and account.deadline_s is not None:
            return account.deadline_s
        return self.settings.task_deadline_s

    def max_run_s(self, target: str) -> float:
        """The longest a task runs on paid ``target`` (``AIGCQ_PAID_MAX_RUN_S``)."""
        return self.settings.paid_max_run_s.get(target, DEFAULT_MAX_RUN_S)

    def apikey(self, aigc: str, platform: str) -> str:
        """The key of the account that runs ``platform`` for ``aigc`` (``""``: none)."""
        account = self.config.account(aigc, platform)
        return account.apikey if account else ""

    def paid_accounts(self) -> set[tuple[str, str]]:
        """(AIGC project, paid target) of every account ``model.json`` configures."""
        found = set()
        for aigc, platform in self.config.queues():
            adapter = self.platforms.adapter_for(platform)
            if adapter is not None and adapter.paid:
                found.add((aigc, adapter.name))
        return found

    def max_attempts(self, account: PlatformAccount | None) -> int:
        if account is not None and account.max_attempts is not None:
            return account.max_attempts
        return self.settings.max_attempts

    def webhook_url(self, task_id: str, attempt: int, target: str = "") -> str:
        """The signed TASK_END URL handed to ``target`` for one attempt of a task."""
        base = self.settings.public_callback_base()
        keep = keeps_results_of(self.settings, target)
        return webhook_url(base, self.settings.signing_key(), task_id, attempt, keep=keep)

    @property
    def dispatch_deadline_s(self) -> float:
        """How long a task may stay DISPATCHING (a process died mid-submit) before retry."""
        return self.settings.http_timeout_s + 5.0
