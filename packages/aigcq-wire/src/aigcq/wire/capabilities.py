"""What a workflow needs and what a ComfyUI instance offers: node classes and model files.

An instance's ``/object_info`` lists its node classes, and each loader's model-file input
(``ckpt_name``, ``lora_name``, ``vae_name``, ...) as a COMBO of the files it has; bridges
report them per instance. A task goes only to an instance that :func:`fits` it: one that
has every node class and model file its workflow names (the hub counts it on such an
instance, free as the bridge last reported, and names it in TASK_ASSIGN); among those the
narrowest (:func:`breadth`) is used first, so the versatile ones stay free for the tasks
only they can run, and one whose models are already loaded (its last prompt used them) is
preferred. An offline instance's offer is withdrawn until it is back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aigcq.wire.bridge import InstanceInfo

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
    """Node classes and model files: what a workflow needs, or what an instance offers.
    Hashed once (placing looks kinds of instance up by it at every dispatch round)."""

    node_classes: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.node_classes, self.models)))

    def __hash__(self) -> int:
        return self._hash

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


def fits(offer: Needs | None, needs: Needs | None) -> bool:
    """Whether an instance offering ``offer`` can run a task needing ``needs``; either not
    known (``None``: a seed bridge's instance, a workflow that could not be read) is not
    ruled out."""
    return needs is None or offer is None or offer.covers(needs)


def breadth(offer: Needs | None) -> float:
    """How much an instance offers (not known: everything, the widest)."""
    if offer is None:
        return float("inf")
    return len(offer.node_classes) + len(offer.models)


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


def offers_of(instances: list[InstanceInfo] | None) -> tuple[Needs, ...] | None:
    """What each instance of a bridge offers, as it reported them; ``None`` when any is not
    known (a seed bridge, an instance whose ``/object_info`` was not read): not ruled out."""
    if not instances:
        return None
    offers = []
    for instance in instances:
        if instance.node_classes is None:
            return None
        offers.append(Needs(frozenset(instance.node_classes), frozenset(instance.models or ())))
    return tuple(offers)


def with_overrides(needs: Needs, workflow: dict[str, Any], node_info: Any) -> Needs:
    """``needs`` with the model files a ``nodeInfoList`` sets instead of the workflow's."""
    if not isinstance(node_info, list):
        return needs
    models = set(needs.models)
    for entry in node_info:
        if not isinstance(entry, dict):
            continue
        field, value = entry.get("fieldName"), entry.get("fieldValue")
        if field not in MODEL_INPUTS or not isinstance(value, str):
            continue
        node = workflow.get(str(entry.get("nodeId")))
        old = ((node or {}).get("inputs") or {}).get(field) if isinstance(node, dict) else None
        if isinstance(old, str) and not _named_elsewhere(workflow, old, node):
            models.discard(old)
        models.add(value)
    return Needs(needs.node_classes, frozenset(models))


def _named_elsewhere(workflow: dict[str, Any], model: str, node: Any) -> bool:
    return any(
        n is not node and model in ((n or {}).get("inputs") or {}).values()
        for n in workflow.values()
        if isinstance(n, dict)
    )
