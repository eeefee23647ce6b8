"""A prompt as ComfyUI checks it before queueing (``validate_prompt``, with its error
types and shapes) and walks it (dependencies, cache keys)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from aigcq.emulators.comfyui.nodes import NodeDef

log = logging.getLogger(__name__)


class PromptRejected(Exception):
    """A 400 answer to ``POST /prompt``."""

    def __init__(self, kind: str, message: str, details: str = "", node_errors: Any = None):
        super().__init__(message)
        self.body = {
            "error": {"type": kind, "message": message, "details": details, "extra_info": {}},
            "node_errors": node_errors or {},
        }


def _input_error(kind: str, message: str, name: str, details: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "message": message,
        "details": details,
        "extra_info": {"input_name": name, **extra},
    }


def _check_value(name: str, spec: tuple[Any, dict[str, Any]], val: Any) -> tuple[Any, list[Any]]:
    """Convert a literal input as ComfyUI does; return (value, errors)."""
    kind, opts = spec
    info = {"input_config": list(spec), "received_value": val}
    if isinstance(kind, list):  # a COMBO: one of the listed values (model files, say)
        if val in kind:
            return val, []
        details = f"{name}: '{val}' not in {kind}"
        return val, [_input_error("value_not_in_list", "Value not in list", name, details, **info)]
    if kind == "STRING":
        return str(val), []
    if kind != "INT":
        msg = f"Failed to convert an input value to a {kind} value"
        return val, [_input_error("invalid_input_type", msg, name, f"{name}, {val}", **info)]
    try:
        val = int(val)
    except (TypeError, ValueError) as e:
        msg = f"Failed to convert an input value to a {kind} value"
        details = f"{name}, {val}, {e}"
        return val, [
            _input_error("invalid_input_type", msg, name, details, exception_message=str(e), **info)
        ]
    if val < opts["min"]:
        msg = f"Value {val} smaller than min of {opts['min']}"
        return val, [_input_error("value_smaller_than_min", msg, name, name, **info)]
    if val > opts["max"]:
        msg = f"Value {val} bigger than max of {opts['max']}"
        return val, [_input_error("value_bigger_than_max", msg, name, name, **info)]
    return val, []


@dataclass
class _Validator:
    prompt: dict[str, Any]
    nodes: dict[str, NodeDef]
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # converted values
    valid: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, list[Any]] = field(default_factory=dict)

    def node(self, node_id: str) -> bool:
        if node_id in self.valid:
            return self.valid[node_id]
        self.valid[node_id] = True  # provisional: breaks link cycles
        node = self.prompt[node_id]
        spec = self.nodes[node["class_type"]]
        raw = node.get("inputs") or {}
        errors: list[Any] = []
        upstream_ok = True
        converted: dict[str, Any] = {}
        for name, input_spec in spec.required.items():
            if name not in raw:
                msg = "Required input is missing"
                errors.append(_input_error("required_input_missing", msg, name, name))
            elif isinstance(raw[name], list):
                link_errors, ok = self._link(name, input_spec, raw[name])
                errors += link_errors
                upstream_ok &= ok
                converted[name] = raw[name]
            else:
                converted[name], value_errors = _check_value(name, input_spec, raw[name])
                errors += value_errors
        self.inputs[node_id] = converted
        if errors:
            self.errors[node_id] = errors
        self.valid[node_id] = not errors and upstream_ok
        return self.valid[node_id]

    def _link(
        self, name: str, spec: tuple[Any, dict[str, Any]], val: list[Any]
    ) -> tuple[list[Any], bool]:
        info = {"input_config": list(spec), "received_value": val}
        if len(val) != 2 or not isinstance(val[1], int) or str(val[0]) not in self.prompt:
            msg = "Bad linked input, must be a length-2 list of [string, int]"
            return [_input_error("bad_linked_input", msg, name, name, **info)], False
        src = str(val[0])
        outputs = self.nodes[self.prompt[src]["class_type"]].outputs
        received = outputs[val[1]] if 0 <= val[1] < len(outputs) else None
        if received != spec[0]:
            msg = "Return type mismatch between linked nodes"
            details = f"{name}, received_type({received}) mismatch input_type({spec[0]})"
            err = _input_error("return_type_mismatch", msg, name, details, linked_node=val)
            return [err], False
        return [], self.node(src)


@dataclass(frozen=True)
class ValidPrompt:
    outputs: list[str]
    inputs: dict[str, dict[str, Any]]
    node_errors: dict[str, Any]


def validate_prompt(prompt: Any, nodes: dict[str, NodeDef]) -> ValidPrompt:
    """ComfyUI's ``validate_prompt``: raises :class:`PromptRejected` with its error types."""
    if not isinstance(prompt, dict):
        raise PromptRejected("invalid_prompt", "Prompt is not a dict", "")
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            msg = "Cannot execute because a node is missing the class_type property."
            raise PromptRejected("invalid_prompt", msg, f"Node ID '#{node_id}'")
        if node["class_type"] not in nodes:
            msg = f"Cannot execute because node {node['class_type']} does not exist."
            raise PromptRejected("invalid_prompt", msg, f"Node ID '#{node_id}'")
    outputs = [i for i, n in prompt.items() if nodes[n["class_type"]].output_node]
    if not outputs:
        raise PromptRejected("prompt_no_outputs", "Prompt has no outputs", "")
    v = _Validator(prompt, nodes)
    good = [o for o in outputs if v.node(o)]
    node_errors: dict[str, Any] = {}
    for out in outputs:
        for node_id in ancestors(prompt, out):
            if node_id in v.errors:
                entry = node_errors.setdefault(
                    node_id,
                    {
                        "errors": v.errors[node_id],
                        "dependent_outputs": [],
                        "class_type": prompt[node_id]["class_type"],
                    },
                )
                entry["dependent_outputs"].append(out)
    if not good:
        details = "\n".join(
            f"{e['message']}: {e['details']}" for n in node_errors.values() for e in n["errors"]
        )
        msg = "Prompt outputs failed validation"
        raise PromptRejected("prompt_outputs_failed_validation", msg, details, node_errors)
    return ValidPrompt(good, v.inputs, node_errors)


def _links(node: dict[str, Any]) -> list[str]:
    return [
        str(v[0])
        for v in (node.get("inputs") or {}).values()
        if isinstance(v, list) and len(v) == 2
    ]


def ancestors(prompt: dict[str, Any], output: str) -> list[str]:
    """``output`` and every node it depends on, dependencies first (each node once)."""
    order: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(output, False)]
    while stack:
        node_id, expanded = stack.pop()
        if expanded:
            order.append(node_id)
            continue
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        stack.append((node_id, True))
        stack.extend((src, False) for src in reversed(_links(prompt[node_id])))
    return order


def signature(prompt: dict[str, Any], node_id: str, memo: dict[str, str]) -> str:
    """A cache key: the node's class and inputs, with links replaced by their sources' keys."""
    if node_id not in memo:
        memo[node_id] = ""  # cycle guard
        node = prompt[node_id]
        inputs = {
            k: [signature(prompt, str(v[0]), memo), v[1]] if isinstance(v, list) else v
            for k, v in sorted((node.get("inputs") or {}).items())
        }
        memo[node_id] = json.dumps([node["class_type"], inputs], sort_keys=True, default=str)
    return memo[node_id]
