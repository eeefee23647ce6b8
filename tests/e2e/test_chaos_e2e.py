"""The chaos run (``bench/chaos.py``) for 60 s: serve, a second serve, their bridges and
Redis SIGKILLed at random, lost create replies, faulty status answers, slow cancels and
client cancels, under steady load. Nothing lost, nothing delivered twice, nothing paid
twice, never above the account's cap, no slot left taken (paid caps, running sets,
orphans, and every bridge slot free as its hub and the bridge itself see it)."""

from __future__ import annotations

from bench.chaos import failures, main, parse


async def test_a_minute_of_chaos_breaks_no_promise() -> None:
    report = await main(parse(["--seconds", "60", "--rate", "8"]))
    assert report["submitted"] > 0
    assert report["targets"].get("bridge", 0) > 0, report  # our GPUs took part
    assert failures(report) == {}, report
