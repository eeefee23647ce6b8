"""What a paid-platform emulator records, per API key, for tests and the chaos run.

Every create (keyed by our task id and attempt, read from the ``t``/``a`` query of the
webhook URL it carried, see :mod:`aigcq.plumbing.signing`; a Coze run carries none), every
cancel, and the peak number of tasks running at once. ``GET /_emulator/records`` answers
:meth:`Records.as_json`; :func:`paid_runs` counts creates per task from it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit


def our_ids(webhook_url: str) -> tuple[str, int | None]:
    """(taskId, attempt) from an aigcq webhook URL; ("", None) when it carries none."""
    query = parse_qs(urlsplit(webhook_url).query)
    task = (query.get("t") or [""])[0]
    attempt = (query.get("a") or [""])[0]
    return task, int(attempt) if attempt.isdigit() else None


class _KeyRecords:
    __slots__ = ("cancels", "creates", "current", "peak")

    def __init__(self) -> None:
        self.creates: list[dict[str, Any]] = []
        self.cancels: list[dict[str, Any]] = []
        self.current = 0
        self.peak = 0


class Records:
    def __init__(self) -> None:
        self._keys: dict[str, _KeyRecords] = {}
        #: remote id -> (api key, our task id, attempt)
        self._remote: dict[str, tuple[str, str, int | None]] = {}

    def _key(self, api_key: str) -> _KeyRecords:
        found = self._keys.get(api_key)
        if found is None:
            found = self._keys[api_key] = _KeyRecords()
        return found

    def created(self, api_key: str, remote_id: str, webhook_url: str = "") -> None:
        """A task was created (and now runs): count it against its key."""
        task, attempt = our_ids(webhook_url)
        rec = self._key(api_key)
        rec.creates.append(
            {"task": task, "attempt": attempt, "remote": remote_id, "at": time.time()}
        )
        self._remote[remote_id] = (api_key, task, attempt)
        rec.current += 1
        rec.peak = max(rec.peak, rec.current)

    def ended(self, api_key: str) -> None:
        self._key(api_key).current -= 1

    def current(self, api_key: str) -> int:
        """The key's tasks running (or queued) now."""
        found = self._keys.get(api_key)
        return found.current if found else 0

    def peaks(self) -> dict[str, int]:
        return {key: rec.peak for key, rec in self._keys.items()}

    def currents(self) -> dict[str, int]:
        return {key: rec.current for key, rec in self._keys.items() if rec.current}

    def cancelled(self, api_key: str, remote_id: str, live: bool) -> None:
        """A cancel arrived; ``live``: the task had not ended yet."""
        _, task, attempt = self._remote.get(remote_id, (api_key, "", None))
        self._key(api_key).cancels.append(
            {"remote": remote_id, "task": task, "attempt": attempt, "live": live, "at": time.time()}
        )

    def as_json(self) -> dict[str, Any]:
        return {
            key: {
                "creates": rec.creates,
                "cancels": rec.cancels,
                "current": rec.current,
                "peak": rec.peak,
            }
            for key, rec in self._keys.items()
        }


def paid_runs(records: dict[str, Any]) -> Counter[str]:
    """Creates per our task id over every key of a ``/_emulator/records`` answer (each
    create is a paid run, cancelled or not)."""
    runs: Counter[str] = Counter()
    for rec in records.values():
        for create in rec["creates"]:
            runs[create["task"]] += 1
    return runs
