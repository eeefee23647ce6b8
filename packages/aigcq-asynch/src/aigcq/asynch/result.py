"""What a model's reply is stored as: file extension (also reported as ``file_type``) and text."""

from __future__ import annotations

import mimetypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

_EXTENSIONS = {
    "application/json": "json",
    "text/plain": "txt",
    "text/html": "html",
    "text/markdown": "md",
    "image/jpeg": "jpg",
    "audio/mpeg": "mp3",
}


@dataclass(frozen=True)
class StoredResult:
    ext: str
    content_type: str
    text: str | None


def classify(content_type: str, content: bytes, text_max_chars: int) -> StoredResult:
    """Extension from the MIME type; text (truncated) for JSON and ``text/*`` replies."""
    mime = content_type.split(";", 1)[0].strip().lower() or "application/octet-stream"
    guessed = (mimetypes.guess_extension(mime) or ".bin").lstrip(".")
    ext = _EXTENSIONS.get(mime, guessed)
    textual = mime == "application/json" or mime.endswith("+json") or mime.startswith("text/")
    text = content.decode("utf-8", errors="replace")[:text_max_chars] if textual else None
    return StoredResult(ext, mime, text)


def is_json_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def reply_problem(content_type: str, content: bytes, schemas: Sequence[Any]) -> str | None:
    """Why a 2xx reply is not a result, or None when it is one.

    An empty body is never a result. A JSON reply (by its Content-Type), or any reply of a
    model whose types declare a ``responseJsonSchema``, must be valid JSON; with schemas it
    must match at least one of them (the subset of JSON Schema of :func:`schema_problem`).
    """
    if not content.strip():
        return "model service answered with an empty body"
    if not schemas and not is_json_type(content_type):
        return None
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        return f"model service answered with invalid JSON: {exc}"
    problems = [p for s in schemas if (p := schema_problem(value, s)) is not None]
    if schemas and len(problems) == len(schemas):
        return f"model reply does not match its responseJsonSchema: {problems[0]}"
    return None


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def schema_problem(value: Any, schema: Any, where: str = "$") -> str | None:
    """Check ``value`` against the JSON Schema keywords ``type``, ``enum``, ``required``,
    ``properties``, ``additionalProperties: false`` and ``items``; others are ignored.

    The first problem found is returned, in that order of keywords."""
    if not isinstance(schema, dict):
        return None
    return (
        _type_problem(value, schema, where)
        or _enum_problem(value, schema, where)
        or _object_problem(value, schema, where)
        or _array_problem(value, schema, where)
    )


def _type_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    types = schema.get("type")
    if types is None:
        return None
    names = types if isinstance(types, list) else [types]
    if any(_TYPES.get(t, lambda v: True)(value) for t in names if isinstance(t, str)):
        return None
    return f"{where} is not of type {types}"


def _enum_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        return f"{where} is not one of {schema['enum']}"
    return None


def _object_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """``required``, ``properties`` and ``additionalProperties: false`` of an object."""
    if not isinstance(value, dict):
        return None
    for name in schema.get("required") or []:
        if name not in value:
            return f"{where}.{name} is required"
    properties = schema.get("properties") or {}
    for name, item in value.items():
        if name in properties:
            if problem := schema_problem(item, properties[name], f"{where}.{name}"):
                return problem
        elif schema.get("additionalProperties") is False:
            return f"{where}.{name} is not allowed"
    return None


def _array_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """``items`` of an array."""
    if not isinstance(value, list) or not isinstance(schema.get("items"), dict):
        return None
    for i, item in enumerate(value):
        if problem := schema_problem(item, schema["items"], f"{where}[{i}]"):
            return problem
    return None
