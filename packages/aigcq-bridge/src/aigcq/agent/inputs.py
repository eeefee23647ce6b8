"""Uploaded inputs: a graph's ``core/ASSET`` references made into files of the instance.

A Comfy API v2 job names an uploaded file where a filename would go (a ``LoadImage``'s
``image``) as ``{"__type": "core/ASSET", "info": {"id", "hash": "blake3:<hex>",
"file_path"}}``. Before the prompt goes to an instance, each is fetched from aigcq by its
hash (:meth:`~aigcq.agent.workflow.WorkflowSource.input`), uploaded to that instance
(``/upload/image``, under a name made of its hash, so the same content always has the same
name) and replaced by the name ComfyUI gave it, once per instance: the instance remembers
it until it goes down (:attr:`~aigcq.agent.instances.ComfyInstance.inputs`). On another
instance it is uploaded there again.
"""

from __future__ import annotations

import mimetypes
import posixpath
import re
from typing import Any

import httpx

from aigcq.agent.following import TaskFailed, machine_failure
from aigcq.agent.instances import ComfyInstance, InputRefused
from aigcq.agent.workflow import Workflow, WorkflowSource
from aigcq.wire.assets import asset_refs, digest_hex, replace_assets

_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,8}")


def input_name(hex_: str, file_path: Any, content_type: str) -> str:
    """The name an input gets on ComfyUI: its hash, and the extension of the client's name
    (else of its type), which loaders look at."""
    ext = posixpath.splitext(file_path)[1] if isinstance(file_path, str) else ""
    if not _EXTENSION.fullmatch(ext):
        ext = mimetypes.guess_extension(content_type) or ""
    return f"aigcq_{hex_[:32]}{ext}"


async def place_inputs(
    workflow: Workflow, instance: ComfyInstance, source: WorkflowSource
) -> Workflow:
    """A copy of ``workflow`` whose ``core/ASSET`` references name files uploaded to
    ``instance`` (``workflow`` itself when it has none). Raises :class:`TaskFailed`
    (an input aigcq no longer has, or ComfyUI refuses) or ``InstanceDown``."""
    refs = asset_refs(workflow)
    if not refs:
        return workflow

    async def one(info: Any) -> str:
        hex_ = digest_hex(info.get("hash")) if isinstance(info, dict) else None
        if hex_ is None:
            raise TaskFailed("task", "MissingAsset", f"a core/ASSET reference has no hash: {info}")
        digest = f"blake3:{hex_}"
        if digest in instance.inputs:  # uploaded to it already (this task or an earlier one)
            return instance.inputs[digest]
        try:
            fetched = await source.input(digest)
        except httpx.HTTPError as e:
            raise machine_failure("InputUnavailable", f"input {digest}: {e}") from None
        if fetched is None:
            raise TaskFailed("task", "MissingAsset", f"aigcq no longer has input {digest}")
        data, media = fetched
        name = input_name(hex_, info.get("file_path"), media)
        try:
            instance.inputs[digest] = await instance.upload_input(name, data, media)
        except InputRefused as e:
            message = f"{instance.instance_id} refused input {digest}: {e}"
            raise TaskFailed("task", "InputRefused", message) from None
        return instance.inputs[digest]

    names = {id(ref): await one(ref.get("info")) for ref in refs}  # in turn: each once
    out: Workflow = replace_assets(workflow, lambda ref: names[id(ref)])
    return out
