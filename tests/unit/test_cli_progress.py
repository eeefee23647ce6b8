"""submit's progress line: a bar for a node's steps, the state for a platform task."""

from __future__ import annotations

from aigcq.cli.submit import describe
from aigcq.client import Progress


def test_node_steps_are_a_bar_with_the_node_and_the_step() -> None:
    line = describe(Progress("t", value=1, max=4, node="3"))
    assert line == f"node 3 [{'█' * 5}{'░' * 15}] step 1/4"


def test_the_bar_names_the_node_when_its_bridge_says_its_name() -> None:
    line = describe(Progress("t", value=2, max=4, node="3", node_name="KSampler"))
    assert line == f"KSampler [{'█' * 10}{'░' * 10}] step 2/4"


def test_a_platform_task_shows_its_state_and_target() -> None:
    assert describe(Progress("t", state="running", target="runninghub")) == (
        "running on runninghub"
    )
