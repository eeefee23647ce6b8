"""JimuAI adapter: signed requests, every documented state and code, credentials in config."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from aigcq.config import ConfigError, PlatformConfig
from aigcq.domain import Task
from aigcq.platforms.base import (
    Accepted,
    Failed,
    Full,
    NotFound,
    Pending,
    Rejected,
    Succeeded,
    Uncertain,
    Unknown,
)
from aigcq.platforms.jimuai import JimuAIAdapter, JimuCredentials, files_result
from aigcq.platforms.registry import registered
from aigcq.queue.store import workflow_of
from aigcq.wire.volc_sign import parse_authorization

APIKEY = JimuCredentials("AK", "SK", req_key="jimeng_t2i_v40").pack()


def make_task(**payload: Any) -> Task:
    return Task("t1", "jimuai", "img", "b1", {"prompt": "a fox", **payload}, remote_id="r9")


def ok(data: Any) -> dict[str, Any]:
    return {"code": 10000, "data": data, "message": "Success", "request_id": "x", "status": 10000}


def err(code: int, message: str = "m") -> dict[str, Any]:
    return {"code": code, "data": None, "message": message, "request_id": "x", "status": code}


def gateway(code: str) -> dict[str, Any]:
    return {"ResponseMetadata": {"Error": {"Code": code, "CodeN": 1, "Message": "m"}}}


@pytest.fixture
def jimu() -> JimuAIAdapter:
    return JimuAIAdapter("https://visual.volcengineapi.com")


def test_registered_as_a_polling_platform() -> None:
    assert registered()["jimuai"] is JimuAIAdapter
    assert JimuAIAdapter.kind == "polling" and JimuAIAdapter.paid
    assert JimuAIAdapter("").base_url == "https://visual.volcengineapi.com"


def test_submit_is_the_payload_signed_with_req_key_from_config(jimu: JimuAIAdapter) -> None:
    req = jimu.submit_request(make_task(width=1024), APIKEY, "http://hook")
    assert req.url == (
        "https://visual.volcengineapi.com/?Action=CVSync2AsyncSubmitTask&Version=2022-08-31"
    )
    assert req.body is not None
    assert orjson.loads(req.body) == {"prompt": "a fox", "width": 1024, "req_key": "jimeng_t2i_v40"}
    assert req.headers["Host"] == "visual.volcengineapi.com"
    auth = parse_authorization(req.headers["Authorization"])
    assert auth is not None and (auth.access_key, auth.region, auth.service) == (
        "AK",
        "cn-north-1",
        "cv",
    )
    assert "SK" not in json.dumps(req.headers)
    own = jimu.submit_request(make_task(req_key="jimeng_i2v"), APIKEY, "")
    assert orjson.loads(own.body or b"")["req_key"] == "jimeng_i2v"


def test_query_asks_for_urls(jimu: JimuAIAdapter) -> None:
    req = jimu.query_request(make_task(), APIKEY)
    assert "Action=CVSync2AsyncGetResult" in req.url
    body = orjson.loads(req.body or b"")
    assert body["task_id"] == "r9" and body["req_key"] == "jimeng_t2i_v40"
    assert json.loads(body["req_json"]) == {"return_url": True}
    assert jimu.cancel_request(make_task(), APIKEY) is None


def test_an_orphan_is_queried_with_the_req_key_its_task_was_created_with(
    jimu: JimuAIAdapter,
) -> None:
    # an orphan has no payload, only the task's workflowId: the payload's req_key
    payload = {"prompt": "a fox", "req_key": "jimeng_i2v"}
    orphan = Task("t1", "jimuai", "img", "", {}, remote_id="r9", workflow_id=workflow_of(payload))
    assert orjson.loads(jimu.query_request(orphan, APIKEY).body or b"")["req_key"] == "jimeng_i2v"
    plain = Task("t1", "jimuai", "img", "", {}, remote_id="r9", workflow_id=workflow_of({}))
    assert orjson.loads(jimu.query_request(plain, APIKEY).body or b"")["req_key"] == (
        "jimeng_t2i_v40"  # the account's
    )


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, ok({"task_id": "7392"}), Accepted("7392")),
        (429, err(50429), Full),
        (429, err(50430), Full),
        (429, gateway("FlowLimitExceeded"), Full),
        (500, err(50500), Rejected),
        (400, err(50412), Rejected),
        (401, gateway("SignatureDoesNotMatch"), Rejected),
        (500, gateway("InternalError"), Rejected),
        (200, ok({}), Uncertain),
        (200, {"weird": True}, Uncertain),
        (502, "bad gateway", Uncertain),  # a gateway's page: the create may have gone through
    ],
)
def test_submit_answers(jimu: JimuAIAdapter, status: int, body: Any, expected: Any) -> None:
    outcome = jimu.parse_submit(status, body)
    if isinstance(expected, type):
        assert isinstance(outcome, expected)
    else:
        assert outcome == expected


def test_submit_retryable_codes(jimu: JimuAIAdapter) -> None:
    retry = {50500: True, 50501: True, 50511: True, 50412: False, 50413: False, 50411: False}
    for code, retryable in retry.items():
        outcome = jimu.parse_submit(400, err(code))
        assert isinstance(outcome, Rejected) and outcome.retryable is retryable, code
    outcome = jimu.parse_submit(500, gateway("InternalServiceTimeout"))
    assert isinstance(outcome, Rejected) and outcome.retryable
    outcome = jimu.parse_submit(401, gateway("InvalidAccessKey"))
    assert isinstance(outcome, Rejected) and not outcome.retryable


def test_query_states_and_codes(jimu: JimuAIAdapter) -> None:
    assert jimu.parse_query(200, ok({"status": "in_queue"})) == Pending("in_queue")
    assert jimu.parse_query(200, ok({"status": "generating"})) == Pending("generating")
    expired = jimu.parse_query(200, ok({"status": "expired"}))
    assert isinstance(expired, Failed) and expired.code == "JIMUAI_EXPIRED"
    video = jimu.parse_query(200, ok({"status": "done", "video_url": "https://a/v.mp4"}))
    assert video == Succeeded(files_result([{"fileUrl": "https://a/v.mp4", "fileType": "mp4"}]))
    empty = jimu.parse_query(200, ok({"status": "done", "image_urls": None}))
    assert isinstance(empty, Failed) and empty.code == "JIMUAI_EMPTY_RESULT"
    for code in (50412, 50500, 50501):
        failed = jimu.parse_query(400, err(code, "Text Risk Not Pass"))
        assert isinstance(failed, Failed) and failed.code == f"JIMUAI_{code}"
        assert not failed.retryable, code


def test_a_post_generation_review_on_get_result_is_a_retryable_failure(
    jimu: JimuAIAdapter,
) -> None:
    # documented "可重试": another generation may pass the output review
    for code in (50511, 50516, 50517, 50519):
        failed = jimu.parse_query(400, err(code, "Post Img Risk Not Pass"))
        assert isinstance(failed, Failed) and failed.code == f"JIMUAI_{code}"
        assert failed.retryable, code


def test_not_found_on_get_result_fails_the_task(jimu: JimuAIAdapter) -> None:
    # "no such task, or older than 12 h": nothing a new (billed) create would fix
    gone = jimu.parse_query(200, ok({"status": "not_found"}))
    assert isinstance(gone, Failed) and gone.code == "JIMUAI_NOT_FOUND"
    assert not gone.retryable and not isinstance(gone, NotFound)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        # the documented format of image_urls is JPEG, whatever the link looks like
        ("https://p9-aiop-sign.byteimg.com/tos-cn-i-x/7a1b~tplv-x-image.image?x-expires=1", "jpeg"),
        ("https://a/1", "jpeg"),
        ("https://a/1.jpeg?sig=x.png", "jpeg"),
        ("https://a/1.JPG", "jpg"),
        ("https://a/1.png", "png"),
        ("https://a/1.webp", "webp"),
    ],
)
def test_the_file_type_of_an_image_url(jimu: JimuAIAdapter, url: str, kind: str) -> None:
    done = jimu.parse_query(200, ok({"status": "done", "image_urls": [url]}))
    assert done == Succeeded(files_result([{"fileUrl": url, "fileType": kind}]))


@pytest.mark.parametrize(
    ("data", "name", "media"),
    [
        (b"\xff\xd8\xff\xe0xx", "0.jpeg", "image/jpeg"),
        (b"\x89PNG\r\n\x1a\nxx", "0.png", "image/png"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "0.webp", "image/webp"),
        (b"unknown", "0.jpeg", "image/jpeg"),  # the documented format
    ],
)
def test_inline_images_are_named_by_their_content(
    jimu: JimuAIAdapter, data: bytes, name: str, media: str
) -> None:
    blob = base64.b64encode(data).decode()
    inline = jimu.parse_query(200, ok({"status": "done", "binary_data_base64": [blob]}))
    assert isinstance(inline, Succeeded)
    [file] = inline.files
    assert (file.name, file.content_type, file.data) == (name, media, data)
    # never read as running: limits, gateway trouble, undocumented states, garbage
    for status, body in [
        (429, err(50429)),
        (429, err(50430)),
        (401, gateway("SignatureDoesNotMatch")),
        (200, ok({"status": "paused"})),
        (200, ok(None)),
        (502, "<html>"),
        (200, {"code": "x"}),
    ]:
        assert isinstance(jimu.parse_query(status, body), Unknown), body
    bad = jimu.parse_query(200, ok({"status": "done", "binary_data_base64": ["%%%"]}))
    assert isinstance(bad, Unknown)


def test_model_json_takes_the_jimuai_account(tmp_path: Path) -> None:
    entry = {"access_key": "AK", "secret_key": "SK", "concurrency": 5, "req_key": "k"}
    (tmp_path / "model.json").write_text(json.dumps({"img": {"jimuai": entry}}))
    config = PlatformConfig.load(tmp_path)
    account = config.account("img", "jimuai")
    assert account is not None and account.concurrency == 5
    creds = JimuCredentials.unpack(account.apikey)
    assert (creds.access_key, creds.secret_key, creds.region, creds.req_key) == (
        "AK",
        "SK",
        "cn-north-1",
        "k",
    )
    assert "SK" not in repr(account) and "SK" not in repr(creds)
    assert "jimuai" in config.kinds.polling
    (tmp_path / "model.json").write_text(json.dumps({"img": {"jimuai": {"access_key": "AK"}}}))
    with pytest.raises(ConfigError, match=r"img\.jimuai\.secret_key"):
        PlatformConfig.load(tmp_path)


# ---- issue 28 item 4: the most outputs a create is billed for ----------------------------


def capped(max_outputs: int | None, req_key: str = "jimeng_t2i_v40") -> str:
    return JimuCredentials("AK", "SK", req_key=req_key, max_outputs=max_outputs).pack()


def sent(jimu: JimuAIAdapter, task: Task, apikey: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(jimu.submit_request(task, apikey, "").body or b"")
    return body


@pytest.mark.parametrize(
    ("max_outputs", "inputs", "force_single", "billed"),
    [
        (None, 0, None, 15),  # the vendor's default: up to 15 images
        (None, 3, None, 12),  # 15 minus the input images
        (15, 0, None, 15),  # the project allows what the model may make: no flag
        (4, 0, True, 1),  # the API's one bound below 15 is its single-output flag
        (1, 3, True, 1),
    ],
)
def test_a_project_maximum_of_outputs_is_applied_before_the_create(
    jimu: JimuAIAdapter,
    max_outputs: int | None,
    inputs: int,
    force_single: bool | None,
    billed: int,
) -> None:
    task = make_task(**({"image_urls": [f"https://in/{i}.jpg" for i in range(inputs)]}))
    apikey = capped(max_outputs)
    assert sent(jimu, task, apikey).get("force_single") is force_single
    assert jimu.billed_units(task, apikey) == billed


def test_single_output_models_and_payloads_asking_one_image(jimu: JimuAIAdapter) -> None:
    # force_single is documented for 即梦 4.0 only; the other models make one image
    other = capped(1, req_key="jimeng_t2i_v30")
    assert "force_single" not in sent(jimu, make_task(), other)
    assert jimu.billed_units(make_task(), other) == 1
    single = make_task(force_single=True)
    assert jimu.billed_units(single, capped(None)) == 1
    assert sent(jimu, single, capped(None))["force_single"] is True


def test_model_json_takes_a_maximum_of_outputs(tmp_path: Path) -> None:
    entry = {"access_key": "AK", "secret_key": "SK", "concurrency": 5, "max_outputs": 1}
    (tmp_path / "model.json").write_text(json.dumps({"img": {"jimuai": entry}}))
    account = PlatformConfig.load(tmp_path).account("img", "jimuai")
    assert account is not None
    assert JimuCredentials.unpack(account.apikey).max_outputs == 1
    for bad in (0, 16):
        (tmp_path / "model.json").write_text(
            json.dumps({"img": {"jimuai": {**entry, "max_outputs": bad}}})
        )
        with pytest.raises(ConfigError, match=r"img\.jimuai\.max_outputs"):
            PlatformConfig.load(tmp_path)
