"""Paid accounts that several AIGC projects share (issue 42 item 6): one key, one cap.

model.json gives each project its account on a platform (``apikey``, ``concurrency``).
Projects that give the same key name the same account, whose concurrency the platform
enforces once for all of them, so the claim scripts keep the sum of their in-flight
tasks (and counted orphans) within the account's cap too: the largest ``concurrency``
any of them configures for that key (each project still within its own). A project
whose key nobody else uses is left out.
"""

from __future__ import annotations

from collections import defaultdict

import orjson

from aigcq.config import PlatformConfig
from aigcq.platforms.client import PlatformClient
from aigcq.scheduler.routing import capped


def shared_keys(config: PlatformConfig, platforms: PlatformClient, most: int) -> dict[str, str]:
    """Per paid target, what ``_prelude.lua``'s ``account_room`` reads: JSON {AIGC:
    [account cap, the other projects on its key, ...]}; ``most``:
    ``AIGCQ_EXTERNAL_CAPACITY_MAX`` (0: none)."""
    keys: defaultdict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for aigc, platform in config.queues():
        adapter, account = platforms.adapter_for(platform), config.account(aigc, platform)
        if adapter is not None and adapter.paid and account is not None and account.apikey:
            keys[(adapter.name, account.apikey)][aigc] = account.concurrency
    shared: defaultdict[str, dict[str, list[object]]] = defaultdict(dict)
    for (target, _), projects in keys.items():
        if len(projects) < 2:
            continue
        cap = capped(max(projects.values()), most)
        for aigc in projects:
            shared[target][aigc] = [cap, *sorted(p for p in projects if p != aigc)]
    return {target: orjson.dumps(accounts).decode() for target, accounts in shared.items()}
