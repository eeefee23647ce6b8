"""The JimuAI emulator served for real: driven by the vendor's own SDK
(``volcengine.visual.VisualService``), by hand-made bad requests, and by aigcq's adapter.

If the vendor's signer and the emulator disagree, the emulator is wrong.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from volcengine.visual.VisualService import VisualService

from aigcq.domain import Task
from aigcq.emulators.jimuai import JimuAIEmulatorConfig, create_app
from aigcq.platforms.base import (
    Accepted,
    Failed,
    Full,
    Pending,
    Rejected,
    Succeeded,
    Unknown,
)
from aigcq.platforms.client import PlatformClient
from aigcq.platforms.jimuai import JimuAIAdapter, JimuCredentials
from aigcq.storage.local import LocalStorage
from aigcq.wire.volc_sign import Credentials, sign, x_date
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

AK, SK = "AKLTtest", "secret-test"
REQ_KEY = "jimeng_t2i_v40"


@contextlib.asynccontextmanager
async def emulator(**options: Any) -> AsyncIterator[str]:
    config = JimuAIEmulatorConfig(**{"duration_s": 0.3, "credentials": {AK: SK}, **options})
    async with serve_app(create_app(config)) as base:
        yield base


def sdk(base: str, sk: str = SK) -> VisualService:
    service = VisualService()
    service.set_ak(AK)
    service.set_sk(sk)
    service.set_host(base.removeprefix("http://"))
    service.set_scheme("http")
    return service


async def call(fn: Callable[[dict[str, Any]], Any], form: dict[str, Any]) -> Any:
    return await asyncio.to_thread(fn, form)


async def stats(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{base}/_emulator/stats")).json()  # type: ignore[no-any-return]


async def inject(base: str, kind: str, count: int = 1) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{base}/_emulator/inject", json={"kind": kind, "count": count})
        assert r.status_code == 200


# ---- the vendor's SDK -----------------------------------------------------------------


async def test_vendor_sdk_submits_and_polls_to_a_jpeg() -> None:
    async with emulator(queue_s=0.1) as base:
        visual = sdk(base)
        started = await call(
            visual.cv_sync2async_submit_task, {"req_key": REQ_KEY, "prompt": "一只狐狸"}
        )
        assert started["code"] == 10000 and started["message"] == "Success"
        task_id = started["data"]["task_id"]
        form = {
            "req_key": REQ_KEY,
            "task_id": task_id,
            "req_json": json.dumps({"return_url": True}),
        }
        first = await call(visual.cv_sync2async_get_result, form)
        assert first["data"]["status"] == "in_queue"

        async def poll() -> Any:
            return await call(visual.cv_sync2async_get_result, form)

        await until(poll, lambda r: r["data"]["status"] == "generating")
        done = await until(poll, lambda r: r["data"]["status"] == "done")
        [url] = done["data"]["image_urls"]
        async with httpx.AsyncClient() as client:
            jpeg = (await client.get(url)).content
        assert jpeg.startswith(b"\xff\xd8\xff")  # the documented output format
        # without return_url: the same image as base64
        plain = await call(visual.cv_sync2async_get_result, {**form, "req_json": "{}"})
        assert base64.b64decode(plain["data"]["binary_data_base64"][0]) == jpeg
        unknown = await call(visual.cv_sync2async_get_result, {**form, "task_id": "1"})
        assert unknown["data"]["status"] == "not_found"


async def test_vendor_sdk_with_a_wrong_secret_is_refused_with_the_gateway_error() -> None:
    async with emulator() as base:
        with pytest.raises(Exception, match="SignatureDoesNotMatch"):
            await call(sdk(base, sk="wrong").cv_sync2async_submit_task, {"req_key": REQ_KEY})
        assert (await stats(base)).get("submits", 0) == 0


async def test_vendor_sdk_sees_the_documented_limit_codes() -> None:
    async with emulator(max_concurrent=1, duration_s=5) as base:
        visual = sdk(base)
        form = {"req_key": REQ_KEY, "prompt": "p"}
        assert (await call(visual.cv_sync2async_submit_task, form))["code"] == 10000
        with pytest.raises(Exception, match="50430"):
            await call(visual.cv_sync2async_submit_task, form)
        await inject(base, "rate_limit")
        with pytest.raises(Exception, match="50429"):
            await call(visual.cv_sync2async_submit_task, form)
        await inject(base, "internal")
        with pytest.raises(Exception, match="50500"):
            await call(visual.cv_sync2async_submit_task, form)
        assert (await stats(base))["peak_running"] == 1


# ---- requests the gateway refuses -------------------------------------------------------


def signed(base: str, body: bytes, *, stamp: str | None = None, sk: str = SK) -> dict[str, str]:
    return sign(
        Credentials(AK, sk),
        method="POST",
        host=base.removeprefix("http://"),
        path="/",
        query={"Action": "CVSync2AsyncSubmitTask", "Version": "2022-08-31"},
        body=body,
        stamp=stamp,
    )


async def test_stale_x_date_and_changed_body_are_refused() -> None:
    async with emulator() as base, httpx.AsyncClient(base_url=base) as client:
        url = "/?Action=CVSync2AsyncSubmitTask&Version=2022-08-31"
        body = json.dumps({"req_key": REQ_KEY, "prompt": "p"}).encode()
        ok = await client.post(url, content=body, headers=signed(base, body))
        assert ok.status_code == 200 and ok.json()["code"] == 10000

        stale = signed(base, body, stamp="20200101T000000Z")
        answer = await client.post(url, content=body, headers=stale)
        assert answer.status_code == 400
        error = answer.json()["ResponseMetadata"]["Error"]
        assert (error["Code"], error["CodeN"]) == ("InvalidTimestamp", 100006)

        changed = body.replace(b'"p"', b'"q"')
        answer = await client.post(url, content=changed, headers=signed(base, body))
        assert answer.status_code == 401
        error = answer.json()["ResponseMetadata"]["Error"]
        assert (error["Code"], error["CodeN"]) == ("SignatureDoesNotMatch", 100010)

        # a changed body with a recomputed X-Content-Sha256 still fails the signature
        forged = {
            **signed(base, body),
            "X-Content-Sha256": signed(base, changed)["X-Content-Sha256"],
        }
        answer = await client.post(url, content=changed, headers=forged)
        assert answer.json()["ResponseMetadata"]["Error"]["Code"] == "SignatureDoesNotMatch"

        # a signature of non-ASCII bytes is a mismatch too, not a 500 (issue 42 item 12)
        good = signed(base, body)
        mangled = good["Authorization"].rsplit("Signature=", 1)[0] + "Signature=é"
        answer = await client.post(
            url, content=body, headers={**good, "Authorization": mangled.encode()}
        )
        assert answer.json()["ResponseMetadata"]["Error"]["Code"] == "SignatureDoesNotMatch"

        unsigned = await client.post(url, content=body, headers={"X-Date": x_date()})
        assert unsigned.json()["ResponseMetadata"]["Error"]["Code"] == "MissingRequestInfo"
        assert (await stats(base))["accepted"] == 1


# ---- aigcq's adapter, through the platform client ----------------------------------------


def make_task(task_id: str = "t1", **payload: Any) -> Task:
    return Task(task_id, "jimuai", "img", "b1", {"prompt": "a fox", **payload})


APIKEY = JimuCredentials(AK, SK, req_key=REQ_KEY).pack()


async def test_adapter_runs_a_task_through_the_emulator(tmp_path: Any) -> None:
    async with emulator(queue_s=0.05) as base:
        adapter = JimuAIAdapter(base)
        storage = LocalStorage(tmp_path, "http://files.test/files")
        client = PlatformClient({"jimuai": adapter}, timeout_s=5, storage=storage)
        try:
            task = make_task()
            accepted = await client.submit(adapter, task, APIKEY, "")
            assert isinstance(accepted, Accepted)
            task.remote_id = accepted.remote_id
            assert isinstance(await client.query(adapter, task, APIKEY), Pending)
            done = await until(
                lambda: client.query(adapter, task, APIKEY), lambda o: not isinstance(o, Pending)
            )
            assert isinstance(done, Succeeded)
            [entry] = done.data["data"]
            assert entry["fileType"] == "jpeg" and entry["fileUrl"].startswith(base)

            await inject(base, "not_found")
            gone = await client.query(adapter, task, APIKEY)
            assert isinstance(gone, Failed) and gone.code == "JIMUAI_NOT_FOUND"
            await inject(base, "expired")
            expired = await client.query(adapter, task, APIKEY)
            assert isinstance(expired, Failed) and expired.code == "JIMUAI_EXPIRED"

            wrong = JimuCredentials(AK, "nope", req_key=REQ_KEY).pack()
            refused = await client.submit(adapter, make_task("t2"), wrong, "")
            assert isinstance(refused, Rejected) and not refused.retryable
            assert refused.code == "JIMUAI_SignatureDoesNotMatch"
            assert isinstance(await client.query(adapter, task, wrong), Unknown)
        finally:
            await client.aclose()


async def test_adapter_stores_base64_only_results_and_backs_off_on_limits(tmp_path: Any) -> None:
    async with emulator(duration_s=0, base64_only=True, max_concurrent=1) as base:
        adapter = JimuAIAdapter(base)
        storage = LocalStorage(tmp_path, "http://files.test/files")
        client = PlatformClient({"jimuai": adapter}, timeout_s=5, storage=storage)
        try:
            task = make_task("t9", req_key=REQ_KEY)
            accepted = await client.submit(adapter, task, APIKEY, "")
            assert isinstance(accepted, Accepted)
            task.remote_id = accepted.remote_id
            done = await client.query(adapter, task, APIKEY)
            assert isinstance(done, Succeeded)
            [entry] = done.data["data"]
            assert entry["fileType"] == "jpeg"
            prefix = "http://files.test/files/platforms/jimuai/"
            assert entry["fileUrl"].startswith(prefix) and "t9" not in entry["fileUrl"]
            stored = tmp_path / entry["fileUrl"].removeprefix("http://files.test/files/")
            assert stored.read_bytes().startswith(b"\xff\xd8\xff")
            again = await client.query(adapter, task, APIKEY)  # asked twice: the same file
            assert isinstance(again, Succeeded) and again.data == done.data
            # An orphan's check only asks whether it ended: nothing is stored for it.
            orphan = make_task("t10", req_key=REQ_KEY)
            created = await client.submit(adapter, orphan, APIKEY, "")
            assert isinstance(created, Accepted)
            orphan.remote_id = created.remote_id
            before = sorted(tmp_path.rglob("*"))
            peeked = await client.peek(adapter, orphan, APIKEY)
            assert isinstance(peeked, Succeeded) and peeked.files
            assert sorted(tmp_path.rglob("*")) == before

            await inject(base, "rate_limit")
            assert isinstance(await client.submit(adapter, make_task("t3"), APIKEY, ""), Full)
            await inject(base, "concurrency")
            assert isinstance(await client.submit(adapter, make_task("t4"), APIKEY, ""), Full)
            await inject(base, "internal")
            internal = await client.submit(adapter, make_task("t5"), APIKEY, "")
            assert isinstance(internal, Rejected) and internal.retryable
        finally:
            await client.aclose()
