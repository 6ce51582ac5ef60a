"""A failed query says why in one line, awaited or not, classic or Spark Connect: the listener
`register` adds (`spark_qtransport.spark.failures`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport.spark.failures import failure_line


def _background_failure(spark: Any, pg: Backend, names: Any, checkpoint: str, name: str) -> Any:
    """A query whose sink's destination does not exist, started and left alone."""
    q, e = pg.create_queue(names("Bg")), pg.create_queue(names("error"))
    pg.send(q, nsb_headers("b1"), b"{}")
    return (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e).load()
            .select("body", "message_type").writeStream.format("sqlqueue").queryName(name)
            .option("url", pg.url).option("endpoint", q).option("destination", names("Nowhere"))
            .option("checkpointLocation", checkpoint).start())


def _failed(query: Any, timeout: float = 120) -> None:
    """Wait for `query` to end, and require that it ended by failing: a query still running after
    `timeout` is a timeout, and one that stopped without an exception did not fail."""
    deadline = time.monotonic() + timeout
    while query.isActive:
        if time.monotonic() >= deadline:
            pytest.fail(f"the query was still running after {timeout:.0f}s: it was expected to fail")
        time.sleep(0.2)
    assert query.exception() is not None, "the query ended without failing"


def _failure_lines(caplog: pytest.LogCaptureFixture, name: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:  # the listener's event arrives shortly after the query ends
        found = [r.getMessage() for r in caplog.records
                 if r.name == "spark_qtransport.failures" and r.levelno == logging.ERROR and name in r.getMessage()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_background_query_that_fails_says_why_in_one_line(spark: Any, pg: Backend, names: Any, checkpoint: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "spark_qtransport")
    name = names("background")
    query = _background_failure(spark, pg, names, checkpoint, name)
    _failed(query)
    [line] = _failure_lines(caplog, name)
    assert line.startswith(f"query '{name}' failed: QueueNotFoundError: ") and "does not exist" in line, line
    assert names("Nowhere") in line and "\n" not in line


def test_over_spark_connect_too(connect: Any, pg: Backend, names: Any, tmp_path: Any,
                                caplog: pytest.LogCaptureFixture) -> None:
    from spark_qtransport.spark.failures import report_failures

    caplog.set_level(logging.ERROR, "spark_qtransport")
    report_failures(connect)  # opt-in over Connect (register leaves it out: its gRPC stream)
    try:
        name = names("remote")
        query = _background_failure(connect, pg, names, str(tmp_path / "ckpt"), name)
        _failed(query)
        [line] = _failure_lines(caplog, name)
        assert line.startswith(f"query '{name}' failed: QueueNotFoundError: ") and "\n" not in line, line
    finally:  # no listener stream left running in the test session
        connect.streams.removeListener(connect._sqlqueue_failures)
        del connect._sqlqueue_failures


def test_spark_s_own_failures_are_its_first_line() -> None:
    text = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [DIVIDE_BY_ZERO] Division by zero."
            " SQLSTATE: 22012\n== Stack ==\nat x")
    assert failure_line("q", "1", text) == "query 'q' failed: [DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012"
    assert failure_line(None, "1", "boom") == "query 1 failed: boom"
