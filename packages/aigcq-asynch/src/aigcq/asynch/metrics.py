"""The state model-asynch exports on ``/metrics``: queue-limit gate use per model, success
callbacks owed and given up."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aigcq.asynch.runtime import gate_key
from aigcq.observability.metrics import Source


def asynch_state(app: FastAPI) -> Source:
    """A metrics source over the service attached to ``app`` (none yet: no state)."""

    async def state() -> list[Metric]:
        svc = app.state.asynch
        if svc is None:
            return []
        models = sorted(await svc.gate.models())
        pipe = svc.redis.pipeline(transaction=False)
        for model in models:
            pipe.zcard(gate_key(model))
        used = GaugeMetricFamily(
            "aigcq_asynch_gate_used", "Live tasks holding a queue-limit slot.", labels=["model"]
        )
        for model, count in zip(models, await pipe.execute(), strict=True):
            used.add_metric([model], int(count))
        callbacks = GaugeMetricFamily(
            "aigcq_asynch_callbacks",
            "Success callbacks owed (not delivered yet) and given up after every try.",
            labels=["state"],
        )
        for state, n in (await svc.callbacks.counts()).items():
            callbacks.add_metric([state], n)
        return [used, callbacks]

    return state
