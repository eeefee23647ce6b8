"""Volcengine request signature: vectors computed offline with the vendor's own signer.

Each expected header below came from ``volcengine.auth.SignerV4.sign`` (volcengine 1.0.229)
with its clock pinned to the given ``X-Date`` and the same inputs; the test needs no SDK.
"""

from __future__ import annotations

import json

import pytest

from aigcq.wire.volc_sign import (
    Credentials,
    canonical_host,
    canonical_query,
    parse_authorization,
    sign,
)

SUBMIT = {"Action": "CVSync2AsyncSubmitTask", "Version": "2022-08-31"}
GET_RESULT = {"Action": "CVSync2AsyncGetResult", "Version": "2022-08-31"}


VECTORS = [
    pytest.param(
        Credentials("AKLTexampleaccesskey", "exampleSecretKey=="),
        "visual.volcengineapi.com",
        SUBMIT,
        json.dumps({"req_key": "jimeng_t2i_v40", "prompt": "a red fox"}).encode(),
        "20260101T120000Z",
        "f01408dcde8a2da9bc389905b608726bf194a0825106a5fd209583d0fa062a31",
        "HMAC-SHA256 Credential=AKLTexampleaccesskey/20260101/cn-north-1/cv/request, "
        "SignedHeaders=content-type;host;x-content-sha256;x-date, "
        "Signature=18f4dfe77f92b27b0e842c29bf26404486b41c7b057b31bae553f866b3597ca7",
        id="submit on the public host",
    ),
    pytest.param(
        Credentials("AK2", "SK/with+chars="),
        "127.0.0.1:9103",
        GET_RESULT,
        b'{"req_key": "jimeng_t2i_v40", "task_id": "7392616336519610409", '
        b'"req_json": "{\\"return_url\\": true}", '
        b'"prompt": "\xe4\xb8\x80\xe5\x8f\xaa\xe7\x8b\x90\xe7\x8b\xb8"}',
        "20261201T080910Z",
        "e74222a1c6e8f9146ab433fe02ca1fddd885c7543fceef369aa354fb4d1a3dd4",
        "HMAC-SHA256 Credential=AK2/20261201/cn-north-1/cv/request, "
        "SignedHeaders=content-type;host;x-content-sha256;x-date, "
        "Signature=600ca119da185f01d9d9bbcf4ae67ecc9020f6f79767a80fa1043896d32210a6",
        id="get-result with a port and a UTF-8 body",
    ),
]


@pytest.mark.parametrize(
    ("creds", "host", "query", "body", "stamp", "content_sha", "authorization"), VECTORS
)
def test_vendor_vectors(
    creds: Credentials,
    host: str,
    query: dict[str, str],
    body: bytes,
    stamp: str,
    content_sha: str,
    authorization: str,
) -> None:
    headers = sign(creds, method="POST", host=host, path="/", query=query, body=body, stamp=stamp)
    assert headers["X-Content-Sha256"] == content_sha
    assert headers["Authorization"] == authorization


def test_parse_authorization_round_trip_and_garbage() -> None:
    headers = sign(
        Credentials("AK", "SK", region="cn-beijing"),
        method="POST",
        host="h",
        path="/",
        query=SUBMIT,
        body=b"{}",
        stamp="20260101T000000Z",
    )
    auth = parse_authorization(headers["Authorization"])
    assert auth is not None
    assert (auth.access_key, auth.date, auth.region, auth.service) == (
        "AK",
        "20260101",
        "cn-beijing",
        "cv",
    )
    assert auth.signed_headers == ("content-type", "host", "x-content-sha256", "x-date")
    for bad in ("", "Bearer x", "HMAC-SHA256 Credential=AK/1/2, Signature=s"):
        assert parse_authorization(bad) is None


def test_canonical_pieces() -> None:
    assert canonical_query({"b": "x y", "a": "~1+"}) == "a=~1%2B&b=x%20y"
    assert canonical_host("visual.volcengineapi.com:443") == "visual.volcengineapi.com"
    assert canonical_host("127.0.0.1:9103") == "127.0.0.1:9103"
    assert "SK" not in repr(Credentials("AK", "SK"))
