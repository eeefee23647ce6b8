"""Task / bridge context on log lines: ``extra=ctx(...)`` in JSON and in the text format."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from aigcq.observability import logconfig
from aigcq.observability.jsonlog import JsonFormatter, TextFormatter, ctx

TEXT = "%(levelname)s %(name)s: %(message)s"


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, logging.StreamHandler[io.StringIO]]]:
    """A real logger writing to a string through a handler whose formatter the test sets."""
    handler = logging.StreamHandler(io.StringIO())
    logger = logging.getLogger("aigcq.test_jsonlog")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def test_ctx_leaves_out_what_does_not_apply() -> None:
    assert ctx() == {}
    assert ctx(task="t1") == {"taskId": "t1"}
    assert ctx(bridge="b1") == {"bridgeId": "b1"}
    assert ctx(task="t1", bridge=None) == {"taskId": "t1"}
    assert ctx(task="t1", bridge="b1") == {"taskId": "t1", "bridgeId": "b1"}


def test_a_log_call_with_context_writes_json_with_task_and_bridge(
    capture: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = capture
    handler.setFormatter(JsonFormatter())
    logger.warning("bridge %s: task %s assigned", "b1", "t1", extra=ctx(task="t1", bridge="b1"))
    logger.info("task %s: cancelled", "t2", extra=ctx(task="t2"))
    logger.info("no context")
    first, second, third = (json.loads(x) for x in handler.stream.getvalue().splitlines())
    assert first["message"] == "bridge b1: task t1 assigned"
    assert (first["taskId"], first["bridgeId"], first["level"]) == ("t1", "b1", "WARNING")
    assert second["taskId"] == "t2" and "bridgeId" not in second
    assert "taskId" not in third and "bridgeId" not in third


def test_text_lines_append_the_context_before_any_traceback(
    capture: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = capture
    handler.setFormatter(TextFormatter(TEXT))
    logger.info("task %s: back to waiting", "t1", extra=ctx(task="t1", bridge="b1"))
    logger.info("bridge %s: stopped", "b1", extra=ctx(bridge="b1"))
    logger.info("plain")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("task %s: failed", "t3", extra=ctx(task="t3"))
    lines = handler.stream.getvalue().splitlines()
    assert lines[0] == "INFO aigcq.test_jsonlog: task t1: back to waiting task=t1 bridge=b1"
    assert lines[1] == "INFO aigcq.test_jsonlog: bridge b1: stopped bridge=b1"
    assert lines[2] == "INFO aigcq.test_jsonlog: plain"
    assert lines[3] == "ERROR aigcq.test_jsonlog: task t3: failed task=t3"
    assert lines[-1] == "ValueError: boom"


def test_the_cli_text_format_carries_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logconfig.LOG_FORMAT_ENV, raising=False)
    handlers, level = logging.root.handlers[:], logging.root.level
    logging.root.handlers = []
    try:
        logconfig.configure_logging("INFO")
        (handler,) = logging.root.handlers
        assert isinstance(handler.formatter, TextFormatter)
        record = logging.LogRecord("aigcq.x", logging.INFO, __file__, 1, "m", None, None)
        record.__dict__.update(ctx(task="t1"))
        assert handler.format(record).endswith("INFO aigcq.x: m task=t1")
    finally:
        logging.root.handlers = handlers
        logging.root.setLevel(level)
