"""Model CRUD, model types with the prompts-core sync, and bad input."""

from __future__ import annotations

import pytest

from tests.fakes.asynch import Asynch, Served


async def test_model_crud(asynch: Asynch) -> None:
    await asynch.db.execute(
        "INSERT INTO asynch_models_type (type_id, type) VALUES (1, 'a'), (2, 'b'), (3, 'c')"
    )
    created = await asynch.create_model(
        "m1", "http://127.0.0.1:9/", headMsg="API_KEY:k,API_STATE:true", httpMethod="get",
        form='[{"field": "prompt", "label": "Prompt", "type": "text", "required": true}]',
        modelsType="1,2,3", maxConcurrency=5, queueLimit=20, retryTimes=3,
    )  # fmt: skip
    assert created["baseUrl"] == "http://127.0.0.1:9"
    assert created["httpMethod"] == "GET" and created["form"][0]["field"] == "prompt"
    assert created["timeoutSeconds"] == 1800 and created["enabled"] == 1

    updated = await asynch.ok("POST", "/model/updateModel", json={
        "modelName": "m1", "enabled": 0, "queueLimit": 7, "remark": "r"
    })  # fmt: skip
    assert (updated["enabled"], updated["queueLimit"], updated["remark"]) == (0, 7, "r")
    assert updated["maxConcurrency"] == 5

    got = await asynch.ok("GET", "/model/getModel", params={"modelName": "m1"})
    assert got["queueLimit"] == 7
    await asynch.create_model("m2", "http://127.0.0.1:9")
    assert [m["modelName"] for m in await asynch.ok("GET", "/model/listModel")] == ["m1", "m2"]
    enabled = await asynch.ok("GET", "/model/listModel", params={"enabled": 1})
    assert [m["modelName"] for m in enabled] == ["m2"]

    await asynch.ok("POST", "/model/deleteModel", json={"modelName": "m1"})
    await asynch.error("GET", "/model/getModel", "MODEL_NOT_FOUND", params={"modelName": "m1"})


BASE = {"modelName": "x", "baseUrl": "http://h"}


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({"modelName": "x"}, "INVALID_ARGUMENT", "baseUrl"),
        ({"modelName": "x", "baseUrl": "not a url"}, "INVALID_ARGUMENT", "baseUrl"),
        ({**BASE, "httpMethod": "PUT"}, "INVALID_ARGUMENT", "httpMethod"),
        ({**BASE, "headMsg": "novalue"}, "INVALID_HEAD_MSG", "entry 1"),
        ({**BASE, "headMsg": "A:1,:v"}, "INVALID_HEAD_MSG", "entry 2"),
        ({**BASE, "headMsg": "bad name:v"}, "INVALID_HEAD_MSG", "header name"),
        ({**BASE, "headMsg": "A:1,content-length:9"}, "INVALID_HEAD_MSG", "HTTP client"),
        ({**BASE, "maxConcurrency": -1}, "INVALID_ARGUMENT", "maxConcurrency"),
        ({**BASE, "maxConcurrency": "5"}, "INVALID_ARGUMENT", "maxConcurrency"),
        ({**BASE, "queueLimit": True}, "INVALID_ARGUMENT", "queueLimit"),
        ({**BASE, "enabled": True}, "INVALID_ARGUMENT", "enabled"),
        ({**BASE, "timeoutSeconds": 5.0}, "INVALID_ARGUMENT", "timeoutSeconds"),
        ({**BASE, "timeoutSeconds": 1e15}, "INVALID_ARGUMENT", "timeoutSeconds"),
        ({**BASE, "autoCleanSeconds": 2**31}, "INVALID_ARGUMENT", "autoCleanSeconds"),
        ({**BASE, "remark": "a\u0000b"}, "INVALID_ARGUMENT", "remark"),
        ({**BASE, "route": "/\u0000"}, "INVALID_ARGUMENT", "route"),
        ({**BASE, "baseUrl": "http://169.254.169.254/"}, "MODEL_HOST_NOT_ALLOWED", "link-local"),
        ({**BASE, "modelsType": "1,a"}, "INVALID_ARGUMENT", "modelsType"),
        ({**BASE, "form": "{oops"}, "INVALID_ARGUMENT", "form"),
        ({"modelName": "bad name", "baseUrl": "http://h"}, "INVALID_ARGUMENT", "modelName"),
    ],
)  # fmt: skip
async def test_bad_model_input_changes_nothing(
    asynch: Asynch, body: dict[str, object], code: str, fragment: str
) -> None:
    message = await asynch.error("POST", "/model/createModel", code, json=body)
    assert fragment in message
    assert await asynch.ok("GET", "/model/listModel") == []


async def test_the_seeds_example_works_on_a_fresh_database(
    asynch: Asynch, model_emu: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 003, step one, before any model type exists (issue 30 item 2); a type created
    later applies to the model from then on."""
    example = {
        "modelName": "model-service", "modelsType": "1,2,3", "baseUrl": model_emu.url,
        "route": "/api/v1/chat", "httpMethod": "POST",
        "headMsg": "API_KEY:model-key,API_STATE:true,API_NUM:123", "enabled": 1,
        "maxConcurrency": 5, "queueLimit": 20, "timeoutSeconds": 1800, "expectedSeconds": 600,
        "retryTimes": 3, "retryQueueMaxSeconds": 600, "autoCleanSeconds": 3600,
        "remark": "Model-Service 模型服务",
    }  # fmt: skip
    created = await asynch.ok("POST", "/model/createModel", json=example)
    assert created["modelsType"] == "1,2,3"
    assert "modelsType lists 1, 2, 3, not in asynch_models_type yet" in caplog.text
    schema = '{"type": "object", "required": ["never"]}'
    await asynch.db.execute(
        "INSERT INTO asynch_models_type (type_id, type, response_json_schema) VALUES (2, 'x', %s)",
        (schema,),
    )
    task_id = await asynch.create_task("model-service")
    assert await asynch.wait_state(task_id, 3) == 3  # the reply does not match type 2's schema
    assert "never" in (await asynch.row(task_id))["error"]


async def test_model_conflicts(model_emu: Served, asynch: Asynch) -> None:
    await asynch.create_model("m", model_emu.url, queueLimit=5)
    await asynch.error("POST", "/model/createModel", "MODEL_EXISTS",
                       json={"modelName": "m", "baseUrl": "http://h"})  # fmt: skip
    await asynch.error("POST", "/model/updateModel", "MODEL_NOT_FOUND",
                       json={"modelName": "zz", "enabled": 0})  # fmt: skip
    await asynch.error("POST", "/model/deleteModel", "MODEL_NOT_FOUND", json={"modelName": "zz"})
    model_emu.app.state.behaviour.latency = 1  # keep the task live
    await asynch.create_task("m")
    await asynch.error("POST", "/model/deleteModel", "MODEL_BUSY", json={"modelName": "m"})
    assert (await asynch.ok("GET", "/model/getModel", params={"modelName": "m"}))["modelName"]


async def test_model_type_crud_syncs_to_prompts_core(asynch: Asynch, prompts_emu: Served) -> None:
    asynch.svc.types.prompts_core_url = prompts_emu.url
    created = await asynch.ok("POST", "/model/type/createModelType", json={
        "type": "text2img", "promptInfo": "draw {x}", "responseJsonSchema": {"type": "object"},
        "version": 2,
    })  # fmt: skip
    assert created["typeId"] == 1 and created["version"] == "2"
    assert prompts_emu.app.state.prompts == [{
        "modelTypeId": 1, "modelType": "text2img", "promptInfo": "draw {x}",
        "responseJsonSchema": '{"type": "object"}', "version": "2",
    }]  # fmt: skip
    updated = await asynch.ok("POST", "/model/type/updateModelType",
                              json={"typeId": 1, "version": "3"})  # fmt: skip
    assert updated["version"] == "3" and prompts_emu.app.state.prompts[-1]["version"] == "3"
    assert (await asynch.ok("GET", "/model/type/getModelType", params={"typeId": 1}))["type"]
    assert len(await asynch.ok("GET", "/model/type/listModelType")) == 1
    await asynch.error("POST", "/model/type/createModelType", "MODEL_TYPE_EXISTS",
                       json={"type": "text2img"})  # fmt: skip
    await asynch.ok("POST", "/model/type/deleteModelType", json={"typeId": 1})
    await asynch.error("GET", "/model/type/getModelType", "MODEL_TYPE_NOT_FOUND",
                       params={"typeId": 1})  # fmt: skip


async def test_an_explicit_type_id_moves_later_ids_past_it(
    asynch: Asynch, prompts_emu: Served
) -> None:
    asynch.svc.types.prompts_core_url = prompts_emu.url
    create = "/model/type/createModelType"
    assert (await asynch.ok("POST", create, json={"typeId": 3, "type": "a"}))["typeId"] == 3
    assert (await asynch.ok("POST", create, json={"type": "b"}))["typeId"] == 4
    assert (await asynch.ok("POST", create, json={"typeId": 2, "type": "c"}))["typeId"] == 2
    assert (await asynch.ok("POST", create, json={"type": "d"}))["typeId"] == 5
    await asynch.error("POST", create, "MODEL_TYPE_EXISTS", json={"typeId": 5, "type": "e"})
    await asynch.ok("POST", "/model/type/deleteModelType", json={"typeId": 5})
    assert (await asynch.ok("POST", create, json={"typeId": 1, "type": "f"}))["typeId"] == 1
    assert (await asynch.ok("POST", create, json={"type": "g"}))["typeId"] == 6  # not 5 again


async def test_prompts_core_down_leaves_no_row(asynch: Asynch, prompts_emu: Served) -> None:
    asynch.svc.types.prompts_core_url = "http://127.0.0.1:9"  # nothing listens there
    message = await asynch.error("POST", "/model/type/createModelType",
                                 "PROMPTS_CORE_SYNC_FAILED", json={"type": "t"})  # fmt: skip
    assert "createPrompt" in message
    assert await asynch.ok("GET", "/model/type/listModelType") == []

    asynch.svc.types.prompts_core_url = prompts_emu.url
    kept = await asynch.ok(
        "POST", "/model/type/createModelType", json={"type": "t", "version": "1"}
    )
    prompts_emu.app.state.fail = True
    await asynch.error("POST", "/model/type/createModelType", "PROMPTS_CORE_SYNC_FAILED",
                       json={"type": "u"})  # fmt: skip
    await asynch.error("POST", "/model/type/updateModelType", "PROMPTS_CORE_SYNC_FAILED",
                       json={"typeId": kept["typeId"], "version": "9"})  # fmt: skip
    rows = await asynch.ok("GET", "/model/type/listModelType")
    assert [(r["type"], r["version"]) for r in rows] == [("t", "1")]
