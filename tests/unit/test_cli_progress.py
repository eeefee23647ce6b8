"""submit's progress: a bar for a node's steps, the state for a platform task, and one
display for several tasks."""

from __future__ import annotations

import io

from rich.console import Console

from aigcq.cli.submit import Board, Job, describe
from aigcq.client import AigcqError, Progress


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


def test_several_tasks_share_one_display_and_each_end_is_a_line() -> None:
    """``aigcq submit`` with several tasks: one live display, a row per task until it
    ends, then a line for it above the display (issue 29 item 6: six submits garbled)."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    jobs = [Job("comfyui", {}, f"t{i}") for i in range(3)]
    with Board(console, jobs) as board:
        board.show("t0", describe(Progress("t0", value=1, max=2, node_name="KSampler")))
        assert rows(board) == ["t0", "t1", "t2"]
        assert board.display.tasks[0].description == "0 of 3 done"
        board.done("t0", {"status": "success"})
        failure = {"code": "PromptValidation", "message": "bad", "detail": {"class": "task"}}
        board.done("t1", {"status": "failed", "error": failure})
        board.done("t2", AigcqError("PlatformError", "不支持的平台。", "nosuch"))
        assert rows(board) == [] and board.display.tasks[0].description == "3 of 3 done"
    text = out.getvalue()
    assert "t0: success" in text
    assert "t1: failed: PromptValidation (task): bad" in text
    assert "t2: refused: PlatformError: 不支持的平台。 (nosuch)" in text


def rows(board: Board) -> list[str]:
    return [t.fields["name"] for t in board.display.tasks[1:]]
