"""Issue 19 end to end: ``platform: "jimuai"`` through real ``aigcq serve`` processes, real
Redis and the JimuAI emulator (a process, checking every request's Volcengine signature)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import httpx
import pytest

from tests.fakes.client import Client, generate
from tests.fakes.processes import Cluster
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e

AK, SK = "AKLTe2e", "e2e-jimuai-secret"


def setup(
    cluster: Cluster, *emulator_args: str, cap: int = 5, deadline_s: float = 600, **env: str
) -> tuple[Any, int, str]:
    jimu = cluster.emulator("jimuai", "--access-key", AK, "--secret-key", SK, *emulator_args)
    account = {
        "access_key": AK,
        "secret_key": SK,
        "concurrency": cap,
        "req_key": "jimeng_t2i_v40",
        "deadline_s": deadline_s,
    }
    cluster.write_models({"proj": {"jimuai": account}})
    server, port = cluster.server(AIGCQ_JIMUAI_URL=jimu, **{"AIGCQ_POLL_INTERVAL_S": "0.1", **env})
    return server, port, jimu


def job(i: int | str) -> dict[str, Any]:
    return generate(f"j-{i}", platform="jimuai", prompt=f"fox {i}")


async def stats(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{base}/_emulator/stats")).json()  # type: ignore[no-any-return]


async def all_succeed(client: Client, count: int, jimu: str, timeout: float) -> dict[str, Any]:
    """Send ``count`` jobs, check each succeeded once; what the emulator saw."""
    for i in range(count):
        await client.send(job(i))
    await client.collect(count, timeout=timeout)
    assert {r[0]["status"] for r in client.results.values()} == {"success"}
    await client.close()
    return await stats(jimu)


async def download(url: str) -> bytes:
    async with httpx.AsyncClient() as http:
        response = await http.get(url)
    assert response.status_code == 200, url
    return response.content


@pytest.mark.parametrize("inline", [False, True], ids=["url", "base64"])
async def test_client_gets_a_file_url_that_downloads_a_jpeg(cluster: Cluster, inline: bool) -> None:
    args = ("--duration", "0.3", *(["--base64-only"] if inline else []))
    _, port, jimu = setup(cluster, *args)
    client = await Client(port, "biz-jimu").connect()
    reply = await client.request(job(0))
    assert reply["type"] == "submitted"
    await client.collect(1, timeout=20)
    [result] = client.results["j-0"]
    assert result["status"] == "success"
    assert result["data"]["code"] == 0  # RunningHub's /outputs shape, as for comfyui
    [entry] = result["data"]["data"]
    assert entry["fileType"] == "jpeg"  # the documented output format
    # URL answers point at the platform; base64 answers were stored and are served by aigcq
    assert entry["fileUrl"].startswith(f"http://127.0.0.1:{port}/files/" if inline else jimu)
    jpeg = await download(entry["fileUrl"])
    assert jpeg.startswith(b"\xff\xd8\xff") and jpeg.endswith(b"\xff\xd9")
    await client.close()


async def test_200_tasks_at_concurrency_5_never_run_more_than_5(cluster: Cluster) -> None:
    # the emulator would take 100 at once: the cap it must not see exceeded is aigcq's
    _, port, jimu = setup(
        cluster, "--duration", "0.05", "--max-concurrent", "100", AIGCQ_POLL_INTERVAL_S="0.05"
    )
    seen = await all_succeed(await Client(port, "biz-200").connect(), 200, jimu, timeout=90)
    assert seen["peak_running"] == 5
    assert (seen["accepted"], seen["duplicates"]) == (200, {})


async def test_rate_limit_answers_are_back_off_not_failure(cluster: Cluster) -> None:
    _, port, jimu = setup(cluster, "--duration", "0.1", "--qps", "2", AIGCQ_FULL_BACKOFF_S="0.2")
    seen = await all_succeed(await Client(port, "biz-qps").connect(), 8, jimu, timeout=40)
    assert seen["code_50429"] > 0  # JimuAI did say "QPS limit" ...
    assert seen["accepted"] == 8 and seen["duplicates"] == {}  # ... and nothing ran twice


async def test_sigkill_of_serve_mid_run_loses_nothing_and_pays_nothing_twice(
    cluster: Cluster,
) -> None:
    server, port, jimu = setup(cluster, "--duration", "1.5", "--max-concurrent", "20", cap=20)
    client = await Client(port, "biz-kill").connect()
    for i in range(20):
        await client.request(job(i))  # read the replies: unread frames stall ws.close()
    # submitted and running on JimuAI (1.5 s each), not finished
    await until(lambda: stats(jimu), lambda s: s.get("accepted", 0) == 20, within=10)
    assert (await stats(jimu))["accepted"] > 0
    server.kill()
    restart = functools.partial(
        cluster.server, port, AIGCQ_JIMUAI_URL=jimu, AIGCQ_POLL_INTERVAL_S="0.1"
    )
    again = await client.resumed(restart, 20)
    assert sorted(again.results) == sorted(f"j-{i}" for i in range(20))
    assert all(len(r) == 1 and r[0]["status"] == "success" for r in again.results.values())
    seen = await stats(jimu)
    assert (seen["accepted"], seen["duplicates"]) == (20, {})
    await again.close()


@pytest.mark.parametrize("req_key", ["", "jimeng_t2i_v30"], ids=["account", "payload"])
async def test_a_cancelled_task_keeps_its_slot_until_jimuai_ends_it(
    cluster: Cluster, req_key: str
) -> None:
    # JimuAI has no cancel: the first task runs on to its end there, inside the cap of 1.
    # It is checked as an orphan, with the req_key it was created with (another one would
    # be "not found" on JimuAI, which would free its slot too early)
    _, port, jimu = setup(cluster, "--duration", "2", "--max-concurrent", "100", cap=1)
    client = await Client(port, "biz-cancel").connect()
    first = job("a")
    if req_key:
        first["payload"]["req_key"] = req_key
    await client.request(first)
    await until(lambda: stats(jimu), lambda s: s.get("accepted", 0) >= 1, within=10)
    reply = await client.request({"type": "cancel", "taskId": "j-a"})
    assert reply["type"] == "cancelled", reply
    await client.request(job("b"))
    await asyncio.sleep(1.0)  # time: b would have been accepted by now
    assert (await stats(jimu))["accepted"] == 1  # b waits: a still runs on JimuAI
    await client.collect(2, timeout=30)
    assert client.results["j-a"][0]["status"] == "cancelled"
    assert client.results["j-b"][0]["status"] == "success"
    seen = await stats(jimu)
    assert (seen["accepted"], seen["peak_running"]) == (2, 1)
    await client.close()


async def test_a_task_past_its_deadline_is_retried_only_once_its_slot_is_free(
    cluster: Cluster,
) -> None:
    # every run outlives its deadline: each is given up on and retried (as for Coze),
    # but each keeps the only slot until JimuAI ends it, so two never run at once
    _, port, jimu = setup(
        cluster,
        *("--duration", "2.2", "--max-concurrent", "100"),
        cap=1,
        deadline_s=0.5,  # given up on at 0.5 s, retried 1 s later: overlapping, unless held
        AIGCQ_MAX_ATTEMPTS="2",
    )
    client = await Client(port, "biz-late").connect()
    await client.request(job("late"))
    await client.collect(1, timeout=30)
    [result] = client.results["j-late"]
    assert (result["status"], result["code"]) == ("failed", "TaskTimeout")
    seen = await stats(jimu)
    assert (seen["accepted"], seen["peak_running"]) == (2, 1)  # MAX_ATTEMPTS runs, one by one
    await client.close()


async def test_a_task_whose_platform_answers_only_rate_limits_is_never_run_twice(
    cluster: Cluster,
) -> None:
    # past its deadline, get-result says only "QPS limit": aigcq cannot tell whether the
    # (paid) task still runs, so it asks again rather than run it a second time
    _, port, jimu = setup(cluster, "--duration", "0.2", deadline_s=0.5)
    async with httpx.AsyncClient() as http:
        inject = {"kind": "result_rate_limit", "count": 10_000}
        assert (await http.post(f"{jimu}/_emulator/inject", json=inject)).status_code == 200
        client = await Client(port, "biz-busy").connect()
        await client.request(job("busy"))
        await asyncio.sleep(2.0)  # time: four deadlines long
        assert not client.results
        await http.post(f"{jimu}/_emulator/inject", json={"kind": "clear"})
    await client.collect(1, timeout=20)
    assert client.results["j-busy"][0]["status"] == "success"
    seen = await stats(jimu)
    assert seen["accepted"] == 1 and seen["code_50429"] > 5
    await client.close()
