"""The one walk of a graph's ``core/ASSET`` references (gateway, paid target, bridge)."""

from __future__ import annotations

from typing import Any

from aigcq.wire.assets import asset_refs, digest_hex, has_assets, replace_assets

HEX = "ab" * 32


def ref(n: int) -> dict[str, Any]:
    return {"__type": "core/ASSET", "info": {"id": f"a{n}", "hash": f"blake3:{HEX}"}}


def test_a_digest_is_blake3_and_64_hex_digits_in_any_case() -> None:
    assert digest_hex(f"blake3:{HEX.upper()}") == HEX
    assert digest_hex(f"sha256:{HEX}") is None
    assert digest_hex(f"blake3:{HEX[:-1]}") is None
    assert digest_hex(None) is None


def test_references_are_found_in_document_order_and_replaced_in_a_copy() -> None:
    graph = {
        "1": {"class_type": "LoadImage", "inputs": {"image": ref(1)}},
        "2": {
            "class_type": "Batch",
            "inputs": {"images": [ref(2), "x.png", ref(3)], "l": ["1", 0]},
        },
    }
    refs = asset_refs(graph)
    assert [r["info"]["id"] for r in refs] == ["a1", "a2", "a3"]
    assert has_assets(graph) and not has_assets({"1": {"inputs": {"image": "x.png"}}})
    out = replace_assets(graph, lambda r: f"file-{r['info']['id']}.png")
    assert out["1"]["inputs"]["image"] == "file-a1.png"
    assert out["2"]["inputs"]["images"] == ["file-a2.png", "x.png", "file-a3.png"]
    assert out["2"]["inputs"]["l"] == ["1", 0]
    assert graph["1"]["inputs"]["image"] == ref(1)  # the original is left as it was
