"""LocalStorage: small files inline, large or slow ones in a thread, errors reach the caller."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from aigcq.storage import StorageError
from aigcq.storage.local import LocalStorage, SlowWrites


async def test_a_small_file_is_written_with_its_folders_and_gets_its_url(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, "http://files.example/")
    url = await storage.put("asynch/a/b.txt", b"hello", "text/plain")
    assert url == "http://files.example/asynch/a/b.txt"
    assert (tmp_path / "asynch/a/b.txt").read_bytes() == b"hello"
    assert not storage.offloading


async def test_a_file_written_again_is_replaced_not_appended(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, "http://files.example")
    await storage.put("x.bin", b"a much longer first version", "application/octet-stream")
    await storage.put("x.bin", b"short", "application/octet-stream")
    assert (tmp_path / "x.bin").read_bytes() == b"short"


async def test_a_file_above_the_inline_limit_is_written_whole(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, "http://files.example", inline_max_bytes=1024)
    data = bytes(range(256)) * 4096  # 1 MiB, written by a thread
    await storage.put("big/blob.bin", data, "application/octet-stream")
    assert (tmp_path / "big/blob.bin").read_bytes() == data


async def test_a_slow_inline_write_sends_the_next_writes_to_a_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalStorage(tmp_path, "http://files.example", slow_write_seconds=0.0)
    with caplog.at_level(logging.WARNING, logger="aigcq.storage.local"):
        for i in range(4):
            await storage.put(f"asynch/t{i}.txt", b"x", "text/plain")
        assert not storage.offloading and not caplog.text  # four of nine slow: not yet
        await storage.put("asynch/t4.txt", b"x", "text/plain")  # five of the last nine
    assert storage.offloading
    assert "asynch/t4.txt" in caplog.text and "thread" in caplog.text
    await storage.put("asynch/t5.txt", b"five", "text/plain")  # offloaded, still written
    assert (tmp_path / "asynch/t5.txt").read_bytes() == b"five"


async def test_offloading_ends_after_its_period(tmp_path: Path) -> None:
    storage = LocalStorage(
        tmp_path, "http://files.example", slow_write_seconds=0.0, offload_seconds=0.2
    )
    for i in range(5):
        await storage.put(f"{i}.txt", b"a", "text/plain")
    assert storage.offloading
    await asyncio.sleep(0.3)  # time: past the 0.2 s offload period
    assert not storage.offloading  # inline again, measured afresh
    await storage.put("5.txt", b"a", "text/plain")
    assert not storage.offloading  # one slow write after the period is not enough again


@pytest.mark.parametrize("inline_max_bytes", [1024, 0])  # inline and in a thread
async def test_a_failed_write_raises_to_the_caller_and_changes_nothing(
    tmp_path: Path, inline_max_bytes: int
) -> None:
    storage = LocalStorage(tmp_path, "http://files.example", inline_max_bytes=inline_max_bytes)
    (tmp_path / "taken").mkdir()  # a folder where the file should go
    with pytest.raises(IsADirectoryError):
        await storage.put("taken", b"data", "text/plain")
    assert (tmp_path / "taken").is_dir() and not any((tmp_path / "taken").iterdir())


@pytest.mark.parametrize("name", ["", "/etc/passwd", "a/../../b", "a//b", "./a"])
async def test_a_name_that_would_leave_the_root_is_refused(tmp_path: Path, name: str) -> None:
    storage = LocalStorage(tmp_path / "root", "http://files.example")
    with pytest.raises(StorageError):
        await storage.put(name, b"x", "text/plain")
    assert not (tmp_path / "root").exists()


def test_stretched_writes_among_fast_ones_are_not_slow_but_a_run_of_them_is() -> None:
    slow = SlowWrites(0.0005)
    assert not any(slow.observe(0.00004) for _ in range(100))
    assert not any(slow.observe(s) for s in [0.05, 0.00004, 0.02, 0.00004, 0.00004, 0.01])
    assert not any(slow.observe(0.00004) for _ in range(100))
    assert [slow.observe(0.0009) for _ in range(5)] == [False] * 4 + [True]
    assert not slow.observe(0.0009)  # starts over once it has said so
