"""Database outages: a server killed and started again, every session terminated, a connection
that hangs. Each test here has a PostgreSQL of its own (the session's is never stopped).

The transport's one retry policy (`session.with_retries`) rides an outage through for the URL's
`outageTimeout`: one WARNING when it starts, one INFO when it ends; past the bound, one error
naming the database and the bound. A connection that hangs is found by the watchdog
(`responseTimeout`) and cut, and the work retried on a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faultproxy import FaultProxy

from spark_qtransport.connections import parse_url
from spark_qtransport.dialects import dialect_for
from spark_qtransport.errors import DatabaseError
from spark_qtransport.transport.session import Session


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    with EmbeddedPostgres(fsync=False) as pg:
        yield pg


@pytest.fixture
def alive(server: Any) -> Iterator[Any]:
    """The module's server, running when the test starts and when it ends."""
    server.start()
    yield server
    server.start()


def session(url: str, **waiting: float) -> Session:
    parsed = parse_url(url).waiting(**waiting)
    return Session(dialect_for(parsed), parsed, what="counting on the test server")


def answer(conn: Any, n: int = 42) -> int:
    return int(conn.execute("SELECT %s::int", (n,)).fetchone()[0])


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("spark_qtransport")]


def test_a_killed_server_started_again_is_ridden_through(alive: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "spark_qtransport")
    s = session(alive.url)
    assert s.run(answer) == 42
    alive.crash()
    threading.Timer(3.0, alive.start).start()
    started = time.monotonic()
    assert s.run(lambda conn: answer(conn, 7)) == 7
    assert time.monotonic() - started >= 2.5, "the answer came from the restarted server"
    warnings, infos = lines(caplog, logging.WARNING), lines(caplog, logging.INFO)
    assert len(warnings) == 1, warnings
    assert "retrying for up to 2 min (outageTimeout)" in warnings[0] and "127.0.0.1" in warnings[0]
    assert [i for i in infos if "answers again" in i], infos
    s.close()


def test_past_the_bound_one_error_names_the_database_and_the_bound(alive: Any) -> None:
    s = session(alive.url, outage=2.0)
    assert s.run(answer) == 42
    alive.crash()
    started = time.monotonic()
    with pytest.raises(DatabaseError) as failed:
        s.run(answer)
    took = time.monotonic() - started
    text = str(failed.value)
    assert "\n" not in text
    assert "longer than outageTimeout (2 s)" in text and f"127.0.0.1:{alive.port}" in text, text
    assert 1.0 < took < 8.0, took


def test_an_outage_timeout_of_zero_fails_at_the_first_fault(alive: Any) -> None:
    s = session(alive.url, outage=0.0)
    assert s.run(answer) == 42
    alive.crash()
    started = time.monotonic()
    with pytest.raises(DatabaseError, match="outageTimeout is 0"):
        s.run(answer)
    assert time.monotonic() - started < 3.0


def test_a_hanging_connection_is_cut_and_the_work_retried(alive: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "spark_qtransport")
    proxy = FaultProxy(alive.url + "?connect_timeout=2")
    try:
        s = session(proxy.url, response=1.0)
        assert s.run(answer) == 42
        proxy.freeze()  # the next statement is sent and never answered; new connections hang too
        threading.Timer(4.0, proxy.thaw).start()
        started = time.monotonic()
        assert s.run(lambda conn: answer(conn, 9)) == 9
        assert time.monotonic() - started >= 3.5
        warnings = lines(caplog, logging.WARNING)
        assert any("no answer for 1 s" in w and "responseTimeout" in w for w in warnings), warnings
        s.close()
    finally:
        proxy.close()


def test_a_long_statement_is_not_taken_for_a_hang(alive: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "spark_qtransport")
    s = session(alive.url, response=1.0)
    assert s.run(lambda conn: conn.execute("SELECT pg_sleep(2.5), 5").fetchone()[1]) == 5
    assert lines(caplog, logging.WARNING) == []
    s.close()
