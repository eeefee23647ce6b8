"""Workflows: find the API-format graph for a task and apply its ``nodeInfoList``.

:func:`parse_workflow`, :func:`apply_node_info` and :func:`coerce` are pure; only
:class:`WorkflowSource` does I/O.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from aigcq.wire.bridge import NodeInfo, TaskAssignData

log = logging.getLogger(__name__)

Workflow = dict[str, Any]
#: how many bytes of fetched inputs a bridge keeps in memory for the tasks that follow
INPUT_CACHE_BYTES = 256 << 20


class WorkflowError(Exception):
    """The workflow or a nodeInfoList entry cannot be used; the message says why."""


class WorkflowNotFound(WorkflowError):
    pass


def parse_workflow(raw: Workflow | str | bytes) -> Workflow:
    """An API-format workflow from a dict or JSON text; rejects UI-format exports."""
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise WorkflowError(f"workflow is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise WorkflowError("workflow must be a JSON object of nodes")
    if "nodes" in raw and "links" in raw:
        raise WorkflowError("workflow is in UI format; export it with 'Save (API)'")
    for node_id, node in raw.items():
        if not isinstance(node, dict) or not isinstance(node.get("inputs", {}), dict):
            raise WorkflowError(f"node {node_id!r} is not an API-format node")
        if "class_type" not in node:
            raise WorkflowError(f"node {node_id!r} has no class_type")
    return raw


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    word = str(value).strip().lower()
    if not isinstance(value, str) or word not in _TRUE | _FALSE:
        raise ValueError(value)
    return word in _TRUE


def _to_int(value: Any) -> int:
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value.strip())  # exact, even for 64-bit seeds
    number = float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def _to_str(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


_CONVERTERS: tuple[tuple[type, str, Callable[[Any], Any]], ...] = (
    (bool, "a boolean", _to_bool),  # before int: bool is an int
    (int, "an integer", _to_int),
    (float, "a number", _to_float),
    (str, "a string", _to_str),
)


def coerce(value: Any, current: Any) -> Any:
    """``value`` converted to the type of the input's ``current`` value.

    bool, int, float and str are converted (``"1231231"`` → ``1231231`` for an INT seed);
    any other current value (None, a dict) takes ``value`` as it is. Raises ``ValueError``.
    """
    for kind, name, convert in _CONVERTERS:
        if isinstance(current, kind):
            try:
                return convert(value)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{value!r} is not {name}") from None
    return value


def node_names(workflow: Workflow) -> dict[str, str]:
    """Each node's name as ComfyUI's UI shows it: its ``_meta.title``, else its
    ``class_type`` (progress names the node, not only its id)."""
    names = {}
    for node_id, node in workflow.items():
        if isinstance(node, dict):
            meta = node.get("_meta")
            title = meta.get("title") if isinstance(meta, dict) else None
            name = title if isinstance(title, str) and title else node.get("class_type")
            if isinstance(name, str) and name:
                names[str(node_id)] = name
    return names


def apply_node_info(workflow: Workflow, node_info: Sequence[NodeInfo]) -> Workflow:
    """A copy of ``workflow`` with each ``nodeInfoList`` entry applied.

    Raises :class:`WorkflowError` for an unknown node or input, a linked input, or a value
    that cannot be converted.
    """
    out = copy.deepcopy(workflow)
    for info in node_info:
        where = f"nodeInfoList: node {info.node_id!r} field {info.field_name!r}"
        node = out.get(info.node_id)
        if node is None:
            raise WorkflowError(f"{where}: node {info.node_id!r} is not in the workflow")
        inputs = node.setdefault("inputs", {})
        if info.field_name not in inputs:
            raise WorkflowError(f"{where}: {node.get('class_type')} has no such input")
        current = inputs[info.field_name]
        if isinstance(current, list):
            raise WorkflowError(f"{where}: the input is a link to another node")
        try:
            inputs[info.field_name] = coerce(info.field_value, current)
        except ValueError as e:
            raise WorkflowError(f"{where}: {e}") from None
    return out


class WorkflowSource:
    """Finds a task's workflow: the one sent, aigcq's registry, then the local folder."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        registry_base: str,
        token: str,
        folder: Path | None,
    ) -> None:
        self.client = client
        self.registry_base = registry_base
        self.token = token
        self.folder = folder
        #: inputs fetched lately (by content), newest last
        self._inputs: OrderedDict[str, tuple[bytes, str]] = OrderedDict()

    async def resolve(self, assign: TaskAssignData) -> Workflow:
        """Raises :class:`WorkflowNotFound` or :class:`WorkflowError`."""
        if assign.workflow is not None:
            return parse_workflow(assign.workflow)
        workflow_id = assign.workflow_id or ""
        found = await self._from_registry(workflow_id)
        if found is None:
            found = self._from_folder(workflow_id)
        if found is None:
            raise WorkflowNotFound(f"workflow {workflow_id!r} not found")
        return parse_workflow(found)

    async def _from_registry(self, workflow_id: str) -> bytes | None:
        url = f"{self.registry_base}/api/workflows/{quote(workflow_id, safe='')}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = await self.client.get(url, headers=headers, timeout=5.0)
        except httpx.HTTPError as e:
            log.warning("workflow %s: registry %s unreachable: %s", workflow_id, url, e)
            return None
        if resp.status_code == 200:
            return resp.content
        if resp.status_code != 404:
            log.warning("workflow %s: registry answered %s", workflow_id, resp.status_code)
        return None

    async def input(self, digest: str) -> tuple[bytes, str] | None:
        """An uploaded input's bytes and type by content (``blake3:<hex>``), from aigcq
        (``GET /api/inputs/…``, the bridge token), kept a while for the next task or
        instance that needs them; None if aigcq has none. Raises ``httpx.HTTPError``."""
        cached = self._inputs.get(digest)
        if cached is not None:
            self._inputs.move_to_end(digest)
            return cached
        url = f"{self.registry_base}/api/inputs/{quote(digest, safe=':')}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await self.client.get(url, headers=headers, timeout=120.0, follow_redirects=True)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        media = resp.headers.get("content-type", "").split(";")[0].strip()
        found = (resp.content, media or "application/octet-stream")
        self._inputs[digest] = found
        while sum(len(data) for data, _ in self._inputs.values()) > INPUT_CACHE_BYTES:
            self._inputs.popitem(last=False)
        return found

    def _from_folder(self, workflow_id: str) -> bytes | None:
        if self.folder is None or not workflow_id or Path(workflow_id).name != workflow_id:
            return None
        path = self.folder / f"{workflow_id}.json"
        return path.read_bytes() if path.is_file() else None
