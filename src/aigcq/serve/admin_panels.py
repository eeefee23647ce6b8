"""Extra parts of the dashboard snapshot: overflow spend and the model-asynch panel.

* **Overflow spend** is read from the same Prometheus counters ``/metrics`` exports
  (``aigcq_overflow_tasks_total``, ``aigcq_overflow_cost_total``: each paid task's
  recorded cost, :mod:`aigcq.scheduler.spend`; ``aigcq_spend_total``'s estimates), beside
  each target's price (``AIGCQ_OVERFLOW_PRICE``). Like those counters it is **per process**
  since it started; the snapshot's ``spend`` (today and this month) is the fleet's, from
  Redis.
* **Model-asynch** is fetched, when ``AIGCQ_ASYNCH_URL`` is set, from that service's
  read-only ``GET /admin/overview`` with this process's admin token (the asynch service
  needs the same ``AIGCQ_ADMIN_TOKEN``). Without the setting the snapshot has
  ``"asynch": null`` and the page hides the panel.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client import Counter

from aigcq.observability import metrics

log = logging.getLogger(__name__)


def overflow_spend(prices: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Tasks accepted per external target and their recorded cost (of it, ``reported``: the
    platform's money, ``estimated``: the configured price where it reported none), this
    process only; each target's ``price`` is None when ``prices`` sets none (a cost it did
    not report is then not counted)."""
    prices = prices or {}
    tasks = _by_target(metrics.OVERFLOW_TASKS)
    cost = _by_target(metrics.OVERFLOW_COST)
    reported = _by_target(metrics.SPEND, basis="reported")
    estimated = _by_target(metrics.SPEND, basis="estimate")
    rows: list[dict[str, Any]] = [
        {
            "target": t,
            "tasks": int(tasks.get(t, 0)),
            "cost": round(cost.get(t, 0.0), 4),
            "reported": round(reported.get(t, 0.0), 4),
            "estimated": round(estimated.get(t, 0.0), 4),
            "price": prices.get(t),
        }
        for t in sorted(set(tasks) | set(cost))
    ]
    return {
        "scope": "process",
        "targets": rows,
        "totalTasks": int(sum(tasks.values())),
        "totalCost": round(sum(cost.values()), 4),
        "prices": dict(prices),
    }


def _by_target(counter: Counter, **labels: str) -> dict[str, float]:
    """A counter's totals per ``target`` label, of the samples with ``labels``."""
    out: dict[str, float] = {}
    for family in counter.collect():
        for s in family.samples:
            if s.name.endswith("_total") and all(s.labels[k] == v for k, v in labels.items()):
                out[s.labels["target"]] = out.get(s.labels["target"], 0.0) + s.value
    return out


class AsynchPanel:
    """Reads model-asynch's ``/admin/overview``; ``None`` when not configured."""

    def __init__(self, url: str, admin_token: str, timeout_s: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.admin_token = admin_token
        self._http: httpx.AsyncClient | None = None
        self.timeout_s = timeout_s

    async def read(self) -> dict[str, Any] | None:
        if not self.url:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            r = await self._http.get(
                f"{self.url}/admin/overview",
                headers={"Authorization": f"Bearer {self.admin_token}"},
            )
            if r.status_code != 200:
                return {"url": self.url, "error": f"HTTP {r.status_code}: {r.text[:200]}"}
            body: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            return {"url": self.url, "error": f"{type(exc).__name__}: {exc}"}
        return {"url": self.url, "error": None, **body}

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
