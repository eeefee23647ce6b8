"""The multipart/form-data splitter the upload routes use: what comfy-sdk and httpx send,
and refusals of what is malformed."""

from __future__ import annotations

import io

import httpx
import pytest
from comfy_low import _multipart

from aigcq.agent.http_server import byte_range
from aigcq.agent.inputs import input_name
from aigcq.plumbing.multipart import MalformedMultipart, parse
from aigcq.wire.assets import has_assets


def test_parses_what_comfy_sdk_sends_with_the_boundary_inside_the_data() -> None:
    data = b"\r\n--bnd not the end\r\n--bndx"
    body, length = _multipart.build_multipart(
        "bnd",
        fields=[("content_type", "image/png"), ("file_path", "a.png"), ("tags", "t")],
        file_name="a.png",
        file_obj=io.BytesIO(data),
        file_content_type="image/png",
        file_size=len(data),
    )
    raw = b"".join(body)
    assert len(raw) == length
    parts = parse(raw, "multipart/form-data; boundary=bnd")
    assert [(p.name, p.filename) for p in parts] == [
        ("content_type", None),
        ("file_path", None),
        ("tags", None),
        ("file", "a.png"),
    ]
    assert parts[-1].data == data and parts[-1].content_type == "image/png"


def test_parses_what_httpx_sends() -> None:
    request = httpx.Request(
        "POST", "http://x/", data={"type": "input"}, files={"image": ("i.png", b"\x89PNG")}
    )
    parts = parse(request.read(), request.headers["content-type"])
    assert [(p.name, p.data) for p in parts] == [("type", b"input"), ("image", b"\x89PNG")]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b--", "text/plain"),
        (b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b--", "multipart/form-data"),
        (b"no boundary here", "multipart/form-data; boundary=b"),
        (
            b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx",
            "multipart/form-data; boundary=b",
        ),
        (b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--", "multipart/form-data; boundary=b"),
        (
            b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--",
            "multipart/form-data; boundary=b",
        ),
        (b"--bXX", "multipart/form-data; boundary=b"),
    ],
)
def test_refuses_malformed_bodies(body: bytes, content_type: str) -> None:
    with pytest.raises(MalformedMultipart):
        parse(body, content_type)


def test_too_many_parts() -> None:
    part = b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n"
    with pytest.raises(MalformedMultipart):
        parse(part * 5 + b"--b--", "multipart/form-data; boundary=b", max_parts=4)


def test_an_input_is_named_by_its_hash_with_the_clients_extension() -> None:
    hex_ = "ab" * 32
    assert input_name(hex_, "dir/photo.JPG", "image/jpeg") == f"aigcq_{hex_[:32]}.JPG"
    assert input_name(hex_, "noext", "image/png") == f"aigcq_{hex_[:32]}.png"
    assert input_name(hex_, "evil.p/ng", "application/x-unknown") == f"aigcq_{hex_[:32]}"
    ref = {"__type": "core/ASSET", "info": {"id": "x"}}
    assert has_assets({"1": {"inputs": {"image": ref}}})
    assert not has_assets({"1": {"inputs": {"image": "a.png", "l": ["2", 0]}}})


def test_a_range_header_names_one_byte_range_or_the_whole() -> None:
    assert byte_range("", 100) is None
    assert byte_range("bytes=0-9", 100) == (0, 9)
    assert byte_range("bytes=90-", 100) == (90, 99)
    assert byte_range("bytes=95-200", 100) == (95, 99)
    assert byte_range("bytes=-10", 100) == (90, 99)
    assert byte_range("bytes=-200", 100) == (0, 99)
    for ignored in ("items=0-1", "bytes=0-1,3-4", "bytes=5-2", "bytes=a-b", "bytes=7"):
        assert byte_range(ignored, 100) is None, ignored
    for unsatisfiable in ("bytes=100-", "bytes=-0"):
        with pytest.raises(ValueError):
            byte_range(unsatisfiable, 100)
