"""A ``multipart/form-data`` body split into its parts (RFC 7578), for the few routes that
take uploads (Comfy API v2 assets, the ComfyUI emulator's ``/upload/image``): the body is
read with a limit first (:mod:`aigcq.plumbing.http_body`), so a part is never larger than
that. Malformed bodies raise :class:`MalformedMultipart` with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message


class MalformedMultipart(ValueError):
    """The body is not ``multipart/form-data`` as its ``Content-Type`` announced."""


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes

    def text(self) -> str:
        try:
            return self.data.decode()
        except UnicodeDecodeError as exc:
            raise MalformedMultipart(f"field {self.name!r} is not UTF-8 text") from exc


def boundary_of(content_type: str) -> str:
    """The boundary of a ``multipart/form-data`` ``Content-Type``."""
    header = Message()
    header["Content-Type"] = content_type
    if header.get_content_type() != "multipart/form-data":
        raise MalformedMultipart("Content-Type must be multipart/form-data")
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise MalformedMultipart("Content-Type names no (valid) boundary")
    return boundary


def parse(body: bytes, content_type: str, max_parts: int = 64) -> list[Part]:
    """The parts of ``body`` in order."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    start = body.find(delimiter)
    if start < 0:
        raise MalformedMultipart("the body has no boundary line")
    parts: list[Part] = []
    pos = start + len(delimiter)
    while True:
        if body.startswith(b"--", pos):  # the closing delimiter
            return parts
        if not body.startswith(b"\r\n", pos):
            raise MalformedMultipart("a boundary line is not followed by CRLF")
        end = _next_delimiter(body, b"\r\n" + delimiter, pos + 2)
        if len(parts) >= max_parts:
            raise MalformedMultipart(f"more than {max_parts} parts")
        parts.append(_part(body[pos + 2 : end]))
        pos = end + 2 + len(delimiter)


def _next_delimiter(body: bytes, delimiter: bytes, start: int) -> int:
    """Where the next delimiter line starts: the delimiter then CRLF or ``--`` (the same
    bytes inside a part's data are data)."""
    while (end := body.find(delimiter, start)) >= 0:
        after = end + len(delimiter)
        if body.startswith((b"\r\n", b"--"), after):
            return end
        start = after
    raise MalformedMultipart("the body ends before its closing boundary")


def _part(raw: bytes) -> Part:
    head, sep, data = raw.partition(b"\r\n\r\n")
    if not sep:
        if not raw.startswith(b"\r\n"):
            raise MalformedMultipart("a part has no header block")
        head, data = b"", raw[2:]
    headers = Message()
    for line in head.decode("latin-1").split("\r\n"):
        if not line:
            continue
        key, colon, value = line.partition(":")
        if not colon:
            raise MalformedMultipart(f"bad part header line {line[:60]!r}")
        headers[key.strip()] = value.strip()
    disposition = headers.get("Content-Disposition", "")
    if not disposition.lower().startswith("form-data"):
        raise MalformedMultipart("a part has no Content-Disposition: form-data")
    name = headers.get_param("name", header="Content-Disposition")
    if not isinstance(name, str) or not name:
        raise MalformedMultipart("a part has no name")
    filename = headers.get_param("filename", header="Content-Disposition")
    kind = headers.get("Content-Type")
    return Part(name, filename if isinstance(filename, str) else None, kind, data)
