"""The ``comfy_v2`` paid target's requests and its reading of Comfy API v2 answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from aigcq.config import Settings
from aigcq.domain import Task
from aigcq.platforms import base
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.comfy_v2 import ComfyV2Adapter
from aigcq.serve.server import build_adapters

GRAPH = {"1": {"class_type": "EmptyImage", "inputs": {}}}


@pytest.fixture
def v2() -> ComfyV2Adapter:
    return ComfyV2Adapter("https://cloud.comfy.org/")


def _task(**kw: object) -> Task:
    return Task("t1", "comfyui", "proj", "b1", {"workflow": GRAPH}, attempt=2, **kw)  # type: ignore[arg-type]


def test_a_create_carries_the_graph_a_key_per_attempt_and_labels(v2: ComfyV2Adapter) -> None:
    req = v2.submit_request(_task(), "sk-1", "http://ignored")
    assert (req.method, req.url) == ("POST", "https://cloud.comfy.org/api/v2/jobs")
    assert req.headers["Authorization"] == "Bearer sk-1"
    assert req.headers["Idempotency-Key"] == "aigcq-t1-2"
    assert req.json == {"workflow": GRAPH, "metadata": {"aigcq_task": "t1", "aigcq_attempt": "2"}}
    again = v2.submit_request(_task(), "sk-1", "")
    assert again.headers["Idempotency-Key"] == "aigcq-t1-2"  # the same attempt: the same key
    open_proxy = ComfyV2Adapter("http://127.0.0.1:8189").submit_request(_task(), "", "")
    assert "Authorization" not in open_proxy.headers
    assert open_proxy.json["metadata"] == "aigcq_task=t1&aigcq_attempt=2"  # the proxy's form


def test_submit_answers(v2: ComfyV2Adapter) -> None:
    assert v2.parse_submit(201, {"id": "j1", "status": "queued"}) == base.Accepted("j1")
    reuse = {
        "error": {"code": "idempotency_key_reuse", "message": "m", "details": {"job_id": "j0"}}
    }
    assert v2.parse_submit(422, reuse) == base.Accepted("j0")  # the attempt's own job
    bare = {"error": {"code": "idempotency_key_reuse", "message": "m"}}
    assert isinstance(v2.parse_submit(422, bare), base.Uncertain)  # never a second create
    full = {"error": {"code": "queue_full", "message": "busy"}}
    assert isinstance(v2.parse_submit(429, full), base.Full)
    broke = {"error": {"code": "insufficient_credits", "message": "top up"}}
    assert isinstance(v2.parse_submit(402, broke), base.Full)
    bad = {"error": {"code": "invalid_workflow", "message": "node 1", "details": {"x": 1}}}
    rejected = v2.parse_submit(422, bad)
    assert isinstance(rejected, base.Rejected) and rejected.code == "COMFY_V2_invalid_workflow"
    assert not rejected.retryable
    assert isinstance(v2.parse_submit(502, {"raw": "<html>"}), base.Uncertain)
    assert isinstance(
        v2.parse_submit(503, {"error": {"code": "upstream_unreachable"}}), base.Uncertain
    )


def test_query_answers(v2: ComfyV2Adapter) -> None:
    task = _task(remote_id="j1")
    assert v2.query_request(task, "k").url == "https://cloud.comfy.org/api/v2/jobs/j1"
    assert v2.parse_query(200, {"status": "running"}) == base.Pending("running")
    assert v2.parse_query(200, {"status": "canceling"}) == base.Pending("canceling")
    out = {
        "node_id": "9", "name": "a.png", "type": "image", "content_type": "image/png",
        "size_bytes": 5, "id": "as1", "hash": None, "url": "https://cloud.comfy.org/api/v2/assets/as1/content",
        "url_expires_at": "2026-12-08T00:00:00+00:00",
    }  # fmt: skip
    done = v2.parse_query(200, {"status": "succeeded", "outputs": [out]})
    assert isinstance(done, base.Succeeded)
    [file] = done.data["data"]
    assert (file["fileUrl"], file["fileType"], file["nodeId"]) == (out["url"], "png", "9")
    failed = v2.parse_query(200, {"status": "failed", "error": {"code": "oom", "message": "m"}})
    assert isinstance(failed, base.Failed) and failed.code == "COMFY_V2_oom"
    assert isinstance(v2.parse_query(200, {"status": "canceled"}), base.Failed)
    assert isinstance(v2.parse_query(404, {"error": {"code": "not_found"}}), base.NotFound)
    assert isinstance(v2.parse_query(200, {"status": "expired"}), base.Unknown)  # never "gone"
    assert isinstance(v2.parse_query(502, None), base.Unknown)
    cancel = v2.cancel_request(task, "k")
    assert cancel is not None and cancel.url == "https://cloud.comfy.org/api/v2/jobs/j1/cancel"
    assert v2.cancel_request(_task(), "k") is None


def test_opt_in_only_where_configured_and_then_comfyuis_target(tmp_path: Path) -> None:
    plain = build_adapters(Settings(config_dir=tmp_path))
    assert "comfy_v2" not in plain
    assert PlatformClient(plain, timeout_s=1).adapter_for("comfyui").name == "runninghub"  # type: ignore[union-attr]
    configured = build_adapters(
        Settings(config_dir=tmp_path, platform_urls={"comfy_v2": "http://cloud"})
    )
    target = PlatformClient(configured, timeout_s=1).adapter_for("comfyui")
    assert target is not None and target.name == "comfy_v2"
    runninghub = PlatformClient(configured, timeout_s=1).adapter_for("runninghub")
    assert runninghub is not None and runninghub.name == "runninghub"


def test_a_task_without_an_inline_graph_is_not_sent(v2: ComfyV2Adapter) -> None:
    assert v2.unsendable(_task()) is None
    by_id = Task("t2", "comfyui", "proj", "b1", {"workflowId": "wf-1", "nodeInfoList": []})
    assert v2.unsendable(by_id) is not None
    as_text = Task("t3", "comfyui", "proj", "b1", {"workflow": '{"1": {"class_type": "X"}}'})
    assert v2.unsendable(as_text) is None
    ref = {"__type": "core/ASSET", "info": {"id": "a1", "hash": "blake3:" + "0" * 64}}
    graph = {"1": {"class_type": "LoadImage", "inputs": {"image": ref}}}
    uploaded = Task("t4", "comfyui", "proj", "b1", {"workflow": graph})
    assert "core/ASSET" in (v2.unsendable(uploaded) or "")  # waits for our GPUs


def test_a_lost_create_is_looked_up_by_its_labels_where_they_are_kept(
    v2: ComfyV2Adapter,
) -> None:
    req = v2.lookup_request(_task(), "sk-1")
    assert req is not None and req.method == "GET"
    assert req.url == (
        "https://cloud.comfy.org/api/v2/jobs?metadata%5Baigcq_task%5D=t1"
        "&metadata%5Baigcq_attempt%5D=2&limit=10"
    )
    assert v2.parse_lookup(200, {"jobs": [{"id": "j7", "status": "running"}]}) == "j7"
    assert v2.parse_lookup(200, {"jobs": []}) is None
    assert v2.parse_lookup(200, {"jobs": [{"id": "a"}, {"id": "b"}]}) is None  # not one
    assert v2.parse_lookup(501, {"error": {"code": "not_implemented"}}) is None
    proxy = ComfyV2Adapter("http://127.0.0.1:8189")
    assert proxy.lookup_request(_task(), "") is None  # a proxy keeps no labels
