"""Which instance a task goes to: one that can run it, preferring the one whose models are
loaded (no model load), else the least busy."""

from __future__ import annotations

from typing import Any

from aigcq.agent.instances import ComfyInstance, InstancePool
from aigcq.wire.capabilities import Needs, needs_of, offered_by

GRAPH = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "b.safetensors"}},
    "7": {"class_type": "LoraLoader", "inputs": {"model": ["4", 0], "lora_name": "l.pt"}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["7", 0]}},
}


def _instance(name: str, offer: Needs | None, loaded: frozenset[str] = frozenset()) -> Any:
    instance = ComfyInstance(f"http://{name}:8188", None, "bridge", 1)  # type: ignore[arg-type]
    instance.healthy, instance.offer, instance.loaded = True, offer, loaded
    return instance


def test_needs_of_a_workflow_and_offer_of_an_object_info() -> None:
    needs = needs_of(GRAPH)
    assert needs.node_classes == {"CheckpointLoaderSimple", "LoraLoader", "SaveImage"}
    assert needs.models == {"b.safetensors", "l.pt"}
    info = {
        "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["b.safetensors"], {}]}}},
        "LoraLoader": {
            "input": {"required": {"lora_name": [["l.pt", "m.pt"]], "model": ["MODEL"]}}
        },
        "SaveImage": {"input": {"required": {"images": ["IMAGE"]}}},
    }
    offer = offered_by(info)
    assert offer.covers(needs) and offer.models == {"b.safetensors", "l.pt", "m.pt"}
    assert offer.missing(Needs(frozenset({"KSampler"}), frozenset({"x"}))) == (
        "node classes: KSampler; model files: x"
    )


def test_the_instance_with_the_models_loaded_first_else_the_least_busy() -> None:
    everything = Needs(frozenset({"CheckpointLoaderSimple"}), frozenset({"a", "b"}))
    first = _instance("first", everything, frozenset({"a"}))
    second = _instance("second", everything, frozenset({"b"}))
    pool = InstancePool([first, second])
    b = Needs(frozenset({"CheckpointLoaderSimple"}), frozenset({"b"}))
    assert pool.acquire("t1", needs=b) is second
    assert pool.acquire("t2", needs=b) is first  # second is busy: no waiting for it
    pool.release(first, "t2")
    pool.release(second, "t1")
    assert pool.acquire("t3", needs=b, affinity=False) is first  # plain least-loaded


def test_only_an_instance_that_can_run_it_and_what_none_offers() -> None:
    small = _instance("small", Needs(frozenset({"SaveImage"}), frozenset()))
    unknown = _instance("unknown", None)  # /object_info not read: not ruled out
    pool = InstancePool([small, unknown])
    needs = needs_of(GRAPH)
    assert pool.acquire("t1", needs=needs) is unknown
    assert pool.lacks(needs) == ""
    pool = InstancePool([small])
    assert pool.acquire("t2", needs=needs) is None
    assert pool.lacks(needs) == (
        "node classes: CheckpointLoaderSimple, LoraLoader; model files: b.safetensors, l.pt"
    )


def test_a_model_nobody_has_loaded_replaces_the_one_loaded_most_often() -> None:
    offer = Needs(frozenset({"CheckpointLoaderSimple"}), frozenset({"a", "b", "c"}))
    b_only = _instance("b-only", offer, frozenset({"b"}))
    a_twice = [_instance(f"a{i}", offer, frozenset({"a"})) for i in range(2)]
    pool = InstancePool([b_only, *a_twice])
    c = Needs(frozenset({"CheckpointLoaderSimple"}), frozenset({"c"}))
    assert pool.acquire("t1", needs=c) in a_twice  # "b" keeps its only warm instance
    fresh = _instance("fresh", offer)
    pool = InstancePool([*a_twice, fresh])
    assert pool.acquire("t2", needs=c) is fresh  # nothing loaded there: nothing lost
