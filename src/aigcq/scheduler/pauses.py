"""Incident pauses: an operator holds a project, a paid account, a workflow or a bridge.

While something is paused its waiting tasks hold: they are neither dispatched there nor
failed, and they run once it is resumed.

* ``project`` (an AIGC project of ``model.json``): none of its queues is dispatched.
* ``account`` (a paid target, ``runninghub``, or one project's account on it,
  ``proj/runninghub``; ``proj/comfyui`` names the same): no new paid create on it. Its
  queues' tasks wait for our GPUs instead (tasks already created there run to their end).
  An account is its key: pausing one project's account pauses every project that uses the
  same key on that platform.
* ``workflow`` (what a payload names in its platform's ``workflow_field``, RunningHub's
  ``workflowId``): its waiting keys leave the queue's ready keys (``pause_workflow.lua``,
  in the step that writes the pause), so the other tasks of the queue run, however many of
  its tasks wait.
* ``bridge``: no new task is assigned to it (a drain); the ones it runs finish.
* ``hold`` (automatic, never an operator's): one project's paid target takes no new create,
  as a paused account but for that project only (no other project with the same key).
  Its name is ``<cause>:<AIGC>/<target>``: ``budget`` (a budget or balance floor is reached,
  :mod:`aigcq.scheduler.budgets`) or ``drift`` (the platform counts more tasks on the
  account than we do, :mod:`aigcq.scheduler.accounts`); whoever set it lifts it once its
  cause is gone.

One Redis hash holds them all (``{prefix}:pauses``, field ``kind:name`` -> when and why), so
they hold on every serve process and across restarts. Each dispatch round reads it in the
pipeline that reads the queues (:mod:`aigcq.scheduler.dispatch`): a round that starts after a
pause was written honours it, whichever process runs it. Writing one publishes ``wake``, so
every process runs such a round at once (a resume dispatches what waited).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)

MAX_NAME = 200  # longest name a pause takes


class PauseKind(enum.StrEnum):
    PROJECT = "project"
    ACCOUNT = "account"
    WORKFLOW = "workflow"
    BRIDGE = "bridge"
    HOLD = "hold"


#: the causes of automatic holds (the first part of a hold's name)
HOLD_BUDGET = "budget"
HOLD_DRIFT = "drift"


def hold_name(cause: str, aigc: str, target: str) -> str:
    return f"{cause}:{aigc}/{target}"


class PauseError(ValueError):
    """A pause or resume that names no such thing (the message says what is known)."""


@dataclass(frozen=True, slots=True)
class Pause:
    kind: PauseKind
    name: str
    since: float
    note: str = ""

    def view(self) -> dict[str, str | float]:
        return {"kind": self.kind.value, "name": self.name, "since": self.since, "note": self.note}


@dataclass(frozen=True, slots=True)
class Paused:
    """The pauses in force, as one dispatch round read them."""

    projects: frozenset[str] = frozenset()
    #: paid targets (``runninghub``) and projects' accounts on them (``proj/runninghub``)
    accounts: frozenset[str] = frozenset()
    workflows: frozenset[str] = frozenset()
    bridges: frozenset[str] = frozenset()
    #: automatic holds, ``<cause>:<AIGC>/<target>``
    holds: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pauses: Iterable[Pause]) -> Paused:
        named: dict[PauseKind, set[str]] = {kind: set() for kind in PauseKind}
        for p in pauses:
            named[p.kind].add(p.name)
        return cls(*(frozenset(named[kind]) for kind in PauseKind))

    def account(self, rt: Runtime, aigc: str, platform: str, target: str) -> bool:
        """Whether paid ``target`` takes no new create for queue ``aigc`` / ``platform``:
        the target is paused, the project's account on it, or another project's account
        with the same key; or an automatic hold keeps the project's target (that project
        only)."""
        here = f"{aigc}/{target}"
        if any(h.partition(":")[2] == here for h in self.holds):
            return True
        if not self.accounts:
            return False
        if target in self.accounts or here in self.accounts:
            return True
        key = rt.apikey(aigc, platform)
        held = (a.partition("/") for a in self.accounts)
        return bool(key) and any(
            t == target and rt.apikey(project, platform) == key for project, _, t in held
        )


def parse(raw: Mapping[Any, Any] | Sequence[Any]) -> list[Pause]:
    """The pauses of ``{prefix}:pauses`` (an HGETALL: a dict, or RESP's flat list); a field
    that is no pause (written by hand) is logged and left out."""
    pairs = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True)
    found = []
    for field, value in pairs:
        kind, _, name = text(field).partition(":")
        try:
            about = orjson.loads(text(value))
            found.append(Pause(PauseKind(kind), name, float(about["since"]), about.get("note", "")))
        except (ValueError, KeyError, TypeError):
            log.warning("pauses: field %r is no pause; ignored", text(field))
    return found


class Pauses:
    """The operator's side: read, set and lift pauses (the dispatch loop reads them itself)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.keys: Keys = rt.store.keys
        self.redis: Redis = rt.redis

    async def all(self) -> list[Pause]:
        found = parse(await self.redis.hgetall(self.keys.pauses))
        return sorted(found, key=lambda p: (p.kind.value, p.name))

    async def set(self, kind: PauseKind, name: str, paused: bool, note: str = "") -> bool:
        """Pause (or resume) ``kind`` ``name`` (as :func:`checked_name` gives it), on every
        process from their next round, which this starts; whether that changed anything."""
        field = f"{kind}:{name}"
        about = orjson.dumps({"since": time.time(), "note": note}) if paused else None
        if kind is PauseKind.WORKFLOW:  # the pause and its ready index in one step
            changed = await self.rt.store.pause_workflow(name, about)
        elif about is not None:
            changed = bool(await self.redis.hsetnx(self.keys.pauses, field, about))
        else:
            changed = bool(await self.redis.hdel(self.keys.pauses, field))
        if changed:
            await self.redis.publish(self.keys.events, "wake")
            log.warning("%s %s: %s%s", kind, name, "paused" if paused else "resumed",
                        f" ({note})" if note else "")  # fmt: skip
        return changed

    def checked_name(self, kind: PauseKind, name: str) -> str:
        """``name`` as a pause of ``kind`` holds it (an account by its target); PauseError
        for a name that is empty, too long, or no project or account of ``model.json``."""
        name = name.strip()
        if not name or len(name) > MAX_NAME or any(c.isspace() for c in name):
            raise PauseError(f"a {kind} name is 1 to {MAX_NAME} characters, no spaces: {name!r}")
        if kind is PauseKind.PROJECT:
            projects = sorted(self.rt.config.accounts)
            if name not in projects:
                raise PauseError(f"no project {name!r} in model.json (projects: {_list(projects)})")
        if kind is PauseKind.ACCOUNT:
            return self._account(name)
        return name

    def _account(self, name: str) -> str:
        """``runninghub``, ``proj/runninghub`` or ``proj/comfyui`` (-> ``proj/runninghub``)."""
        accounts = self.rt.paid_accounts()
        project, _, rest = name.rpartition("/")
        if not project:
            if name in {t for _, t in accounts}:
                return name
        else:
            adapter = self.rt.platforms.adapter_for(rest)
            target = adapter.name if adapter is not None else rest
            if (project, target) in accounts:
                return f"{project}/{target}"
        known = sorted({t for _, t in accounts} | {f"{p}/{t}" for p, t in accounts})
        raise PauseError(f"no paid account {name!r} in model.json (accounts: {_list(known)})")


def _list(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"
