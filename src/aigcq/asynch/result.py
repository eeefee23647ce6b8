"""What a model's reply is stored as: file extension (also reported as ``file_type``) and text."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass

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
