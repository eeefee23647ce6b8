"""The state model-asynch exports on ``/metrics``: queue-limit gate use per model."""

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
        return [used]

    return state
