"""model-asynch pushes what its ``/metrics`` shows through OpenTelemetry too, when the
``OTEL_*`` variables ask (issue 41 §1: every process's metrics, as the serve's): the real
``aigcq asynch`` process exporting to a real OTLP receiver."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.otlp import OtlpReceiver
from tests.fakes.processes import start_asynch, stop


async def test_the_asynch_process_exports_its_metrics(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    receiver = OtlpReceiver().start()
    proc, _ = start_asynch(
        pg_url, redis_url, tmp_path, log=tmp_path / "asynch.log",
        **receiver.env(OTEL_SERVICE_NAME="asynch-under-test"),
    )  # fmt: skip
    try:
        export = await receiver.metrics_until(lambda m: "aigcq_asynch_callbacks" in m.metrics)
        assert export.resource.get("service.name") == "asynch-under-test"
    finally:
        stop(proc)
        receiver.stop()
