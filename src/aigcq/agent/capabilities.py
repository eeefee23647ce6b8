"""What a workflow needs and what a ComfyUI instance offers: node classes and model files.

An instance's ``/object_info`` lists its node classes, and each loader's model-file input
(``ckpt_name``, ``lora_name``, ``vae_name``, ...) as a COMBO of the files it has. A task
runs only on an instance that has every node class and model file its workflow names; among
those, the one whose models are already loaded (its last prompt used them) is preferred.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: inputs whose value names a model file
MODEL_INPUTS = frozenset(
    {
        "ckpt_name",
        "lora_name",
        "vae_name",
        "unet_name",
        "clip_name",
        "clip_name1",
        "clip_name2",
        "control_net_name",
        "upscale_model_name",
        "style_model_name",
        "gligen_name",
    }
)


@dataclass(frozen=True, slots=True)
class Needs:
    """Node classes and model files: what a workflow needs, or what an instance offers."""

    node_classes: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()

    def covers(self, needs: Needs) -> bool:
        return needs.node_classes <= self.node_classes and needs.models <= self.models

    def missing(self, needs: Needs) -> str:
        """``node classes: X; model files: y.safetensors`` (what this offer lacks)."""
        parts = []
        if classes := needs.node_classes - self.node_classes:
            parts.append("node classes: " + ", ".join(sorted(classes)))
        if models := needs.models - self.models:
            parts.append("model files: " + ", ".join(sorted(models)))
        return "; ".join(parts)


def needs_of(workflow: dict[str, Any]) -> Needs:
    """The node classes and model files an API-format workflow names."""
    classes, models = set(), set()
    for node in workflow.values():
        if not isinstance(node, dict):
            continue
        classes.add(str(node.get("class_type")))
        for name, value in (node.get("inputs") or {}).items():
            if name in MODEL_INPUTS and isinstance(value, str):
                models.add(value)
    return Needs(frozenset(classes), frozenset(models))


def offered_by(object_info: Any) -> Needs:
    """What an instance offers, from its ``/object_info`` answer."""
    if not isinstance(object_info, dict):
        return Needs()
    models: set[str] = set()
    for node in object_info.values():
        required = ((node or {}).get("input") or {}).get("required") or {}
        for name, spec in required.items():
            if name in MODEL_INPUTS and isinstance(spec, list) and isinstance(spec[0], list):
                models.update(str(m) for m in spec[0])
    return Needs(frozenset(object_info), frozenset(models))
