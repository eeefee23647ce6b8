"""A short fuzz run over the asynch API: any body, any query, never a 5xx, always the envelope.

Bodies mix the endpoints' own field names with values of every JSON type (NUL characters,
huge and negative numbers, nested objects), unknown fields, non-object JSON and bytes that
are not JSON. Derandomized, so a failure is reproducible; a few hundred requests, a few
seconds (in process: over loopback each request here costs ~40 ms of delayed ACKs).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.asynch import Asynch, Served

POSTS: dict[str, list[str]] = {
    "/model/createModel": [
        "modelName", "modelsType", "form", "baseUrl", "route", "httpMethod", "headMsg",
        "enabled", "maxConcurrency", "queueLimit", "timeoutSeconds", "expectedSeconds",
        "retryTimes", "retryQueueMaxSeconds", "autoCleanSeconds", "remark",
    ],
    "/model/updateModel": ["modelName", "enabled", "queueLimit", "baseUrl", "form", "remark"],
    "/model/deleteModel": ["modelName"],
    "/model/type/createModelType": [
        "typeId", "type", "promptInfo", "responseJsonSchema", "version", "remark",
    ],
    "/model/type/updateModelType": ["typeId", "type", "version", "responseJsonSchema"],
    "/model/type/deleteModelType": ["typeId"],
    "/model/autoTune": ["windowSeconds"],
    "/task/createTask": ["modelName", "requestPayload", "bizName", "callbackUrl", "modelKey"],
    "/task/getTaskBatch": ["taskIds"],
    "/task/runWork": ["batchSize"],
    "/task/cleanWork": [],
}  # fmt: skip
GETS: dict[str, list[str]] = {
    "/model/getModel": ["modelName"],
    "/model/listModel": ["enabled", "page", "pageSize"],
    "/model/type/getModelType": ["typeId"],
    "/model/type/listModelType": ["page", "pageSize"],
    "/task/getTaskResult": ["taskId"],
}

_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["m", "", " ", "\u0000", "a\u0000b", "http://127.0.0.1:9", "1,2", "GET"]),
)
_number = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
)
_scalar = st.one_of(st.none(), st.booleans(), _number, _text)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=8,
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    if draw(st.booleans()):
        path = draw(st.sampled_from(sorted(GETS)))
        names = GETS[path]
        value = st.one_of(_text, _number.map(str))
        params = draw(st.dictionaries(st.sampled_from(names), value, max_size=len(names)))
        return "GET", path, {"params": params}
    path = draw(st.sampled_from(sorted(POSTS)))
    names = POSTS[path] or ["x"]
    shape = draw(st.sampled_from(["fields", "fields", "fields", "json", "bytes"]))
    if shape == "bytes":
        return "POST", path, {"content": draw(st.binary(max_size=64))}
    if shape == "json":
        return "POST", path, {"content": json.dumps(draw(_json)).encode()}
    body = draw(st.dictionaries(st.sampled_from([*names, "unknown"]), _json, max_size=6))
    content = json.dumps(body).encode()  # integers beyond 64 bits too
    return "POST", path, {"content": content, "headers": {"Content-Type": "application/json"}}


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
async def test_fuzz_never_5xx(asynch: Asynch, model_emu: Served, request: Any) -> None:
    if not await asynch.redis.exists("asynch:fuzz"):
        await asynch.create_model("m", model_emu.url)
        await asynch.redis.set("asynch:fuzz", 1)
    method, path, kwargs = request
    transport = httpx.ASGITransport(app=asynch.app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://asynch") as client:
        response = await client.request(method, path, **kwargs)
    assert response.status_code < 500, (method, path, kwargs, response.text)
    body = response.json()
    assert isinstance(body["code"], int) and "message" in body and "data" in body
    assert (body["code"] == 0) == (response.status_code == 200) == ("reason" not in body), body
