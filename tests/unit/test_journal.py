"""The journal of accepted paid creates (issue 25 item 2): a live process's file is never
replayed by another; a dead one's pending entries are, without those Redis already has."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from aigcq.scheduler.journal import AcceptedJournal, Entry, forget


def entry(n: int) -> Entry:
    return Entry(f"t{n}", 1, "b1", f"r{n}", "proj", "comfyui", "runninghub", "callback")


async def test_only_a_dead_processes_pending_entries_are_replayed(tmp_path: Path) -> None:
    mine, other = AcceptedJournal(tmp_path), AcceptedJournal(tmp_path)
    for n in (1, 2):
        await mine.append(entry(n))
    mine.done(entry(1))
    assert list(other.dead()) == []  # its process lives (holds the lock)
    assert mine._fd is not None
    os.close(mine._fd)  # the process dies: its lock goes with it
    [(path, fd, pending)] = list(other.dead())
    assert pending == [entry(2)]
    forget(path, fd)
    assert list(other.dead()) == [] and not os.listdir(tmp_path)


async def test_a_file_with_nothing_pending_is_emptied_and_goes_at_a_clean_stop(
    tmp_path: Path,
) -> None:
    journal = AcceptedJournal(tmp_path)
    await journal.append(entry(1))
    journal.done(entry(1))
    [name] = os.listdir(tmp_path)
    assert os.stat(tmp_path / name).st_size == 0
    journal.close()
    assert not os.listdir(tmp_path)


async def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    journal = AcceptedJournal(tmp_path)
    await journal.append(entry(1))
    assert journal._fd is not None
    os.write(journal._fd, b'{"add": {"task_')  # a crash in the middle of a write
    os.close(journal._fd)
    [(_, fd, pending)] = list(AcceptedJournal(tmp_path).dead())
    assert pending == [entry(1)]
    os.close(fd)


async def test_a_processs_first_concurrent_appends_share_one_file(tmp_path: Path) -> None:
    """The soak bench's find: 32 first appends at once (each in a thread) made 3 to 6
    files, the extra ones never marked done and replayed after the process died."""
    journal = AcceptedJournal(tmp_path)
    await asyncio.gather(*(journal.append(entry(n)) for n in range(32)))
    for n in range(32):
        journal.done(entry(n))
    [name] = os.listdir(tmp_path)
    assert os.stat(tmp_path / name).st_size == 0  # every entry marked done in that one file
