"""Field values as the original Node.js services read them (issue 30 item 4).

The seed's queue backend is JavaScript: a count it compares or decrements is coerced to a
number (``"5" > 0``, ``n--``), an id it puts in a Redis key is coerced to text
(```${prefix}:task:${taskId}```), and a body it receives as a string it ``JSON.parse``-s.
Peers written for it send those forms, so the fields that the seed's service coerced accept
them here, each in one exact form only (anything else is still refused, naming the field):

* :data:`Count` — an integer ≥ 0, or a string of 1–18 ASCII digits (``"8"`` → 8);
* :data:`IdText` — a string, or a JSON integer taken as its decimal text
  (``1910246754753896450`` → ``"1910246754753896450"``, every digit kept where JavaScript
  would have rounded beyond 2**53);
* :data:`JsonObject` — an object, or a string holding one JSON object (parsed once).

See ``docs/compatibility.md`` ("Values the Node.js services coerced").
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

_MAX_DIGITS = 18  # below 2**63: any count, and int() never meets its digit limit


def count_from_digits(value: Any) -> Any:
    """``"8"`` → 8; any other string is refused; other values pass to the int check."""
    if not isinstance(value, str):
        return value
    if 0 < len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError('an integer ≥ 0, or a string of its ASCII digits such as "8"')


def id_text(value: Any) -> Any:
    """A JSON integer → its decimal text; other values pass to the string check."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def object_from_json_text(value: Any) -> Any:
    """A string holding one JSON object → that object; other values pass to the dict check."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        raise ValueError(
            "a JSON object, or a string holding one (this string is not JSON)"
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError("a JSON object, or a string holding one (this string holds no object)")
    return parsed


Count = Annotated[int, BeforeValidator(count_from_digits), Field(ge=0)]
IdText = Annotated[str, BeforeValidator(id_text)]
JsonObject = Annotated[dict[str, Any], BeforeValidator(object_from_json_text)]
