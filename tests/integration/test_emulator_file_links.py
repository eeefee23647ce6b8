"""The RunningHub and JimuAI emulators' result links expire as the vendors' do: after
``file_ttl_s`` from when they were handed out, or on demand (``POST /_emulator/files``).
RunningHub's plain CDN links then answer 404; JimuAI's signed links carry their expiry
(``x-expires``) and answer 403."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from aigcq.emulators import jimuai, runninghub
from aigcq.wire.volc_sign import Credentials, sign
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

KEY = "k" * 32
AK, SK = "AKLTtest", "secret-test"


@contextlib.asynccontextmanager
async def emulated(app: Any) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with serve_app(app) as base, httpx.AsyncClient(base_url=base) as http:
        yield base, http


async def rh_file_url(http: httpx.AsyncClient) -> tuple[str, str]:
    """(remote task id, its result file URL) of a RunningHub task run to its end."""
    body = {"apiKey": KEY, "workflowId": "1904", "nodeInfoList": []}
    task_id = (await http.post("/task/openapi/create", json=body)).json()["data"]["taskId"]
    ask = {"apiKey": KEY, "taskId": task_id}

    async def outputs() -> Any:
        return (await http.post("/task/openapi/outputs", json=ask)).json()

    done = await until(outputs, lambda o: o["code"] == 0)
    return task_id, done["data"][0]["fileUrl"]


async def expire(http: httpx.AsyncClient, which: Any) -> dict[str, Any]:
    answer: dict[str, Any] = (await http.post("/_emulator/files", json={"expire": which})).json()
    return answer


async def test_runninghub_links_answer_404_once_expired_on_demand() -> None:
    config = runninghub.RunningHubEmulatorConfig(duration_s=0)
    async with emulated(runninghub.create_app(config)) as (_, http):
        task_id, url = await rh_file_url(http)
        assert "?" not in url  # a plain CDN path
        assert (await http.get(url)).status_code == 200
        assert (await expire(http, [task_id]))["expired"] == [task_id]
        assert (await http.get(url)).status_code == 404
        _, other = await rh_file_url(http)
        assert (await http.get(other)).status_code == 200
        stats = (await http.get("/_emulator/stats")).json()
        assert stats["succeeded"] == 2


async def test_runninghub_links_expire_after_file_ttl_s() -> None:
    config = runninghub.RunningHubEmulatorConfig(duration_s=0, file_ttl_s=0.3)
    async with emulated(runninghub.create_app(config)) as (_, http):
        _, url = await rh_file_url(http)

        async def status() -> int:
            return (await http.get(url)).status_code

        await until(status, lambda code: code == 404)


async def jimu_result(http: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """The get-result data of a JimuAI task run to its end, asked with ``return_url``."""
    host = base.removeprefix("http://")

    async def post(action: str, body: dict[str, Any]) -> Any:
        raw = json.dumps(body).encode()
        query = {"Action": action, "Version": jimuai.VERSION}
        creds = Credentials(AK, SK)
        headers = sign(creds, method="POST", host=host, path="/", query=query, body=raw)
        return (await http.post("/", params=query, content=raw, headers=headers)).json()

    req = {"req_key": "jimeng_t2i_v40", "prompt": "a fox"}
    task_id = (await post(jimuai.SUBMIT, req))["data"]["task_id"]
    ask = {**req, "task_id": task_id, "req_json": json.dumps({"return_url": True})}
    done = await until(
        lambda: post(jimuai.GET_RESULT, ask), lambda r: r["data"]["status"] == "done"
    )
    data: dict[str, Any] = done["data"]
    return data


async def test_jimuai_links_carry_their_expiry_and_answer_403_once_expired() -> None:
    config = jimuai.JimuAIEmulatorConfig(duration_s=0, credentials={AK: SK}, file_ttl_s=600)
    async with emulated(jimuai.create_app(config)) as (base, http):
        before = time.time()
        [url] = (await jimu_result(http, base))["image_urls"]
        query = parse_qs(urlsplit(url).query)
        assert before + 599 <= int(query["x-expires"][0]) <= time.time() + 601
        assert query["x-signature"][0]
        assert (await http.get(url)).status_code == 200
        await expire(http, "all")
        refused = await http.get(url)
        assert refused.status_code == 403
        assert refused.json()["Code"] == "AccessDenied"
        [fresh] = (await jimu_result(http, base))["image_urls"]  # handed out after "all"
        assert (await http.get(fresh)).status_code == 200
