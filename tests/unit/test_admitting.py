"""admitting: an admitting script that finds Redis without its run id rebuilds and runs again,
a bounded number of times, then says the state is lost."""

from __future__ import annotations

import pytest

from aigcq.asynch.rebuild import REBUILD_NEEDED, RedisStateLost, admitting


class Script:
    """Answers ``answers`` in turn; counts the runs and the rebuilds asked for."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.runs = 0
        self.rebuilds = 0

    async def __call__(self) -> int:
        self.runs += 1
        return self.answers.pop(0)

    async def rebuild(self) -> None:
        self.rebuilds += 1


async def test_the_answer_after_a_rebuild_is_returned() -> None:
    script = Script(REBUILD_NEEDED, REBUILD_NEEDED, 0)
    assert await admitting(script, script.rebuild) == 0
    assert (script.runs, script.rebuilds) == (3, 2)


async def test_a_redis_that_keeps_losing_its_data_is_given_up_on() -> None:
    script = Script(REBUILD_NEEDED, REBUILD_NEEDED, REBUILD_NEEDED, 1)
    with pytest.raises(RedisStateLost):
        await admitting(script, script.rebuild)
    assert (script.runs, script.rebuilds) == (3, 3)


async def test_without_a_rebuild_the_first_refusal_is_final() -> None:
    script = Script(REBUILD_NEEDED, 1)
    with pytest.raises(RedisStateLost):
        await admitting(script, None)
    assert script.runs == 1
