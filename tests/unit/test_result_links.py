"""Signed result file links, and what a vendor's link says of its own expiry."""

from __future__ import annotations

import pytest

from aigcq.delivery.custody import expiry_of
from aigcq.wire.links import EXPIRED, FORGED, link_key, refusal, signed_url

KEY = link_key(b"s" * 32)
NAME = "custody/abc/0.png"


def token_of(url: str) -> str:
    return url.removeprefix("http://aigcq/results/").split("/", 1)[0]


def test_a_link_works_until_its_expiry_then_is_expired() -> None:
    token = token_of(signed_url("http://aigcq/", KEY, NAME, 1000))
    assert refusal(KEY, token, NAME, now=999.5) is None
    assert refusal(KEY, token, NAME, now=1000) is None
    assert refusal(KEY, token, NAME, now=1000.5) == EXPIRED


@pytest.mark.parametrize(
    ("token", "name"),
    [
        ("1000-" + "0" * 32, NAME),  # a made-up signature
        ("2000-{sig}", NAME),  # a later expiry under the same signature
        ("1000-{sig}", "custody/abc/1.png"),  # another file
        ("{sig}", NAME),
        ("-1000-{sig}", NAME),
        ("１０００-{sig}", NAME),  # other scripts' digits
        ("9" * 13 + "-{sig}", NAME),
    ],
)
def test_a_forged_link_is_refused_whatever_its_expiry(token: str, name: str) -> None:
    sig = token_of(signed_url("http://aigcq", KEY, NAME, 1000)).split("-")[1]
    assert refusal(KEY, token.format(sig=sig), name, now=0) == FORGED
    other_key = link_key(b"t" * 32)
    assert refusal(other_key, f"1000-{sig}", NAME, now=0) == FORGED


def test_no_link_is_signed_with_an_empty_key() -> None:
    with pytest.raises(ValueError, match="empty"):
        link_key(b"")


@pytest.mark.parametrize(
    ("url", "expires"),
    [
        ("https://p9-sign.byteimg.com/a.png?rk3s=1&x-expires=1756547190&x-signature=x", 1756547190),
        ("https://b.oss-cn-beijing.aliyuncs.com/a.png?Expires=1700000000&Signature=x", 1700000000),
        (
            "https://s3.example/b/a.png?X-Amz-Date=20250101T000000Z&X-Amz-Expires=86400&X-Amz-Signature=x",
            1735689600 + 86400,
        ),
        ("https://tos.example/a.png?X-Tos-Date=20250101T000000Z&X-Tos-Expires=3600", 1735693200),
        (
            "https://c.cos.ap-beijing.myqcloud.com/a.png?q-sign-time=1700000000;1700086400",
            1700086400,
        ),
        ("https://rh-images.xiaoyaoyou.com/u/output/ComfyUI_00033_.png", None),
        ("https://s3.example/a.png?X-Amz-Date=garbage&X-Amz-Expires=60", None),
        ("https://x/a.png?x-expires=soon", None),
    ],
)
def test_a_vendors_link_says_when_it_expires_where_it_can(url: str, expires: int | None) -> None:
    assert expiry_of(url) == expires
