"""Waiting on a condition instead of sleeping: poll it until it holds or a deadline passes.

``await wait_until(lambda: hub.free_slots() == 2)`` polls a predicate (plain or async) and
returns its first truthy value; on timeout it fails naming what it waited for (``what=``,
else the predicate's source line) and the last value it saw. ``until(probe, done)`` is the
same loop for when the test wants the probed value back (``task = await until(get, ok)``).
``wait_until_sync`` is the twin for code that cannot await (process start-up in threads).

A sleep stays a sleep only when time itself is the subject: "nothing happens for 0.5 s", a
server that is slow on purpose, a deadline that has to pass; say so in a comment beside it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


#: what is awaited, for the failure message: text, or a function that says it at failure
#: time (so it can show the state the test last saw)
What = str | Callable[[], str] | None


def _described(predicate: Callable[..., Any], what: What) -> str:
    """What the caller waits for: ``what``, else the predicate's name or lambda source."""
    if callable(what):
        return what()
    if what:
        return what
    name = getattr(predicate, "__name__", "")
    if name and name != "<lambda>":
        return name
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


class WaitTimeout(AssertionError):
    """A condition did not hold in time (an AssertionError: the test fails, not errors)."""


def _timed_out(timeout: float, what: str, last: Any) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout}s waiting for: {what}; last value: {last!r}")


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 5.0,
    interval: float = 0.02,
    *,
    what: What = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` (sync or async) every ``interval`` s until it returns something
    truthy, and return that; after ``timeout`` s fail with what was awaited and the last
    value. Exceptions of the ``ignore`` types count as "not yet" (a server still starting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            last = value
        except ignore as exc:
            last = exc
        else:
            if value:
                return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise _timed_out(timeout, _described(predicate, what), last)
        await asyncio.sleep(interval)  # the poll interval, not a wait on time


def wait_until_sync(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    interval: float = 0.05,
    *,
    what: What = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_until` for code that cannot await (it blocks the calling thread)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = last = predicate()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, _described(predicate, what), last)
        time.sleep(interval)  # the poll interval, not a wait on time


async def until(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    within: float = 5.0,
    interval: float = 0.02,
) -> T:
    """Call ``probe`` until ``done(result)``; return that result, or fail after ``within`` s
    naming the condition and the last result."""
    last: list[T] = []

    async def holds() -> bool:
        last[:] = [await probe()]
        return done(last[0])

    what = _described(done, None)
    try:
        await wait_until(holds, within, interval, what=what)
    except WaitTimeout:
        raise _timed_out(within, what, last[0] if last else None) from None
    return last[0]
