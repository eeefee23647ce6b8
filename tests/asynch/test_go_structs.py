"""What a Go client of the original service marshals: whole structs with the zero values of
the fields it did not set (no ``omitempty``), nil interfaces and slices (issue 30 item 1)."""

from __future__ import annotations

from typing import Any

from tests.fakes.asynch import Asynch, Served

#: ``Model{}`` marshalled by encoding/json: every field, at its zero value.
GO_ZERO_MODEL: dict[str, Any] = {
    "modelName": "", "modelsType": "", "form": None, "baseUrl": "", "route": "",
    "httpMethod": "", "headMsg": "", "enabled": 0, "maxConcurrency": 0, "queueLimit": 0,
    "timeoutSeconds": 0, "expectedSeconds": 0, "retryTimes": 0, "retryQueueMaxSeconds": 0,
    "autoCleanSeconds": 0, "remark": "",
}  # fmt: skip
#: Seed 003's createModel example (with a form), as a Go caller fills its struct.
SEED_MODEL: dict[str, Any] = {
    "modelName": "model-service", "modelsType": "1,2,3",
    "form": [{"field": "prompt", "label": "Prompt", "type": "text", "required": True}],
    "route": "/api/v1/chat", "httpMethod": "POST",
    "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123", "enabled": 1,
    "maxConcurrency": 5, "queueLimit": 20, "timeoutSeconds": 1800, "expectedSeconds": 600,
    "retryTimes": 3, "retryQueueMaxSeconds": 600, "autoCleanSeconds": 3600,
    "remark": "Model-Service 模型服务",
}  # fmt: skip


def _fields(model: dict[str, Any]) -> dict[str, Any]:
    return {k: model[k] for k in GO_ZERO_MODEL}


async def _seed_model(asynch: Asynch, base_url: str) -> dict[str, Any]:
    await asynch.db.execute(
        "INSERT INTO asynch_models_type (type_id, type) VALUES (1, 'a'), (2, 'b'), (3, 'c')"
    )
    return _fields(await asynch.ok("POST", "/model/createModel",
                                   json={**SEED_MODEL, "baseUrl": base_url}))  # fmt: skip


async def test_a_whole_struct_update_changes_only_the_fields_it_sets(
    asynch: Asynch, model_emu: Served
) -> None:
    created = await _seed_model(asynch, model_emu.url)
    # Model{ModelName: "model-service", MaxConcurrency: 8}: enabled 0, route "", headMsg ""
    one_field = {**GO_ZERO_MODEL, "modelName": "model-service", "maxConcurrency": 8}
    updated = await asynch.ok("POST", "/model/updateModel", json=one_field)
    assert _fields(updated) == {**created, "maxConcurrency": 8}
    await asynch.create_task("model-service")  # still enabled
    # getModel's data with one field changed, sent back whole: every value it gives counts
    got = await asynch.ok("GET", "/model/getModel", params={"modelName": "model-service"})
    disabled = await asynch.ok("POST", "/model/updateModel", json={**got, "enabled": 0})
    assert _fields(disabled) == {**created, "maxConcurrency": 8, "enabled": 0}
    partial = {"modelName": "model-service", "route": "", "headMsg": ""}
    cleared = await asynch.ok("POST", "/model/updateModel", json=partial)
    assert (cleared["route"], cleared["headMsg"], cleared["enabled"]) == ("", "", 0)


async def test_fields_a_go_struct_leaves_unset_take_their_defaults(
    asynch: Asynch, model_emu: Served
) -> None:
    # every field set but autoCleanSeconds (and expectedSeconds): no 0-second retention
    body = {**SEED_MODEL, "modelsType": "", "baseUrl": model_emu.url, "autoCleanSeconds": 0}
    created = await asynch.ok("POST", "/model/createModel", json={**body, "expectedSeconds": 0})
    assert (created["autoCleanSeconds"], created["expectedSeconds"]) == (3600, 600)
    # Model{ModelName, BaseUrl, Route}: the defaults, enabled included
    minimal = {**GO_ZERO_MODEL, "modelName": "minimal", "baseUrl": model_emu.url, "route": "/g"}
    created = await asynch.ok("POST", "/model/createModel", json=minimal)
    assert _fields(created) == {
        **GO_ZERO_MODEL, "modelName": "minimal", "baseUrl": model_emu.url, "route": "/g",
        "form": [], "httpMethod": "POST", "enabled": 1, "maxConcurrency": 1, "queueLimit": 100,
        "timeoutSeconds": 1800, "expectedSeconds": 600, "autoCleanSeconds": 3600,
    }  # fmt: skip


async def test_a_whole_struct_model_type_update(asynch: Asynch, prompts_emu: Served) -> None:
    asynch.svc.types.prompts_core_url = prompts_emu.url
    zero = {"typeId": 0, "type": "", "promptInfo": "", "responseJsonSchema": "", "version": "",
            "remark": ""}  # fmt: skip
    created = await asynch.ok("POST", "/model/type/createModelType",
                              json={**zero, "type": "t2i", "promptInfo": "draw {x}"})  # fmt: skip
    assert (created["typeId"], created["version"]) == (1, "1")
    updated = await asynch.ok("POST", "/model/type/updateModelType",
                              json={**zero, "typeId": 1, "version": "2"})  # fmt: skip
    assert (updated["type"], updated["promptInfo"], updated["version"]) == ("t2i", "draw {x}", "2")


async def test_a_nil_request_payload_is_an_empty_one(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url)
    await asynch.create_model("g", model_emu.url, httpMethod="GET")
    task = {"requestPayload": None, "bizName": "b", "callbackUrl": "", "modelKey": ""}
    for model in ("m", "g"):
        task_id = (await asynch.ok("POST", "/task/createTask",
                                   json={"modelName": model, **task}))["task_id"]  # fmt: skip
        assert await asynch.wait_state(task_id, 2, 3) == 2
        assert '"echo":{}' in (await asynch.row(task_id))["text"]  # POST {} / GET no query
    left_out = {"modelName": "m", "bizName": "b"}  # not Go's nil: a misspelt field, say
    await asynch.error("POST", "/task/createTask", "INVALID_ARGUMENT", json=left_out)


async def test_zero_pages_are_the_default_pages(asynch: Asynch) -> None:
    for i in range(3):
        await asynch.create_model(f"m{i}", "http://127.0.0.1:9")
    for params in ({"page": 0, "pageSize": 0}, {"page": 0}, {}):
        models = await asynch.ok("GET", "/model/listModel", params=params)
        assert [m["modelName"] for m in models] == ["m0", "m1", "m2"], params
    second = await asynch.ok("GET", "/model/listModel", params={"page": 2, "pageSize": 2})
    assert [m["modelName"] for m in second] == ["m2"]
    zero = {"page": 0, "pageSize": 0}
    assert await asynch.ok("GET", "/model/type/listModelType", params=zero) == []
    for params in ({"page": -1}, {"pageSize": -1}, {"pageSize": 501}):
        await asynch.error("GET", "/model/listModel", "INVALID_ARGUMENT", params=params)
