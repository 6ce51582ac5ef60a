"""Database outages: a server killed and started again, every session terminated, a connection
that hangs. Each test here has a PostgreSQL of its own (the session's is never stopped).

The transport's one retry policy (`session.with_retries`) rides an outage through for the URL's
`outageTimeout`: one WARNING when it starts, one INFO when it ends; past the bound, one error
naming the database and the bound. A connection that hangs is found by the watchdog
(`responseTimeout`) and cut, and the work retried on a new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faultproxy import FaultProxy

from backends import Backend, nsb_headers, server_settings
from spark_qtransport.connections import parse_url
from spark_qtransport.dialects import dialect_for
from spark_qtransport.errors import DatabaseError, unwrap
from spark_qtransport.transport.session import Session

pytestmark = pytest.mark.db  # servers of its own, stopped and started


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    # a crash keeps what the server acknowledged: commits wait for their WAL to be written (to the
    # kernel: the machine does not crash here). Without it (synchronous_commit off) a crash loses
    # the last commits the server confirmed, and no client can make up for that.
    with EmbeddedPostgres(fsync=False, settings=server_settings(synchronous_commit="on")) as pg:
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
    assert "2 min" in warnings[0] and "outageTimeout" in warnings[0] and "127.0.0.1" in warnings[0]  # the bound, its option
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
    assert "`outage_timeout`" in text and "(2 s)" in text and f"127.0.0.1:{alive.port}" in text, text
    assert 1.0 < took < 8.0, took


def test_an_outage_given_up_on_is_over_when_nobody_meets_it(alive: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that gave up past the bound leaves no outage behind: a fault long after it (here
    after STALE, shortened) starts a new one, which the next attempt rides through."""
    from spark_qtransport.transport import session as db

    monkeypatch.setattr(db, "STALE", 0.5)
    s = session(alive.url, outage=1.0)
    assert s.run(answer) == 42
    alive.crash()
    with pytest.raises(DatabaseError, match="`outage_timeout`"):
        s.run(answer)
    alive.start()
    time.sleep(1.0)
    _terminate_every_session(Backend(alive.url))  # the next attempt's connection is terminated once
    assert s.run(lambda conn: answer(conn, 5)) == 5
    s.close()


def test_an_outage_timeout_of_zero_fails_at_the_first_fault(alive: Any) -> None:
    s = session(alive.url, outage=0.0)
    assert s.run(answer) == 42
    alive.crash()
    started = time.monotonic()
    with pytest.raises(DatabaseError, match="`outage_timeout` is 0"):
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


# -- a stream and its sink ------------------------------------------------------------------------

def _count(pg: Backend, table: str) -> int:
    """Rows in `table`, or -1 while the server is away."""
    try:
        return pg.count(table)
    except Exception:  # noqa: BLE001 - the server is down: not counted yet
        return -1


def _until(cond: Any, timeout: float, what: str, query: Any) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if query is not None and not query.isActive:
            raise AssertionError(f"the query ended while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            pg = Backend(query._url) if hasattr(query, "_url") else None
            raise AssertionError(f"timed out waiting for {what}: {query and query.lastProgress}; "
                                 f"{_activity(pg) if pg else ''}")
        time.sleep(0.2)


def _activity(pg: Backend) -> list[Any]:
    with pg.connect() as c:
        return c.execute("SELECT pid, state, wait_event, left(query, 120) FROM pg_stat_activity "
                         "WHERE application_name = 'spark-qtransport' AND pid <> pg_backend_pid()").fetchall()


def _pipeline(spark: Any, url: str, q: str, out: str, e: str, checkpoint: str, **options: str) -> Any:
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("sqlqueue").option("url", url).option("queue", q).option("errorQueue", e)
              .option("maxMessagesPerTrigger", "25").option("numPartitions", "1"))
    writer_options = {"inlineBytes": options.pop("inlineBytes", "0")}  # tasks stage: staging meets the outage
    for key, value in options.items():
        reader = reader.option(key, value)
        writer_options[key] = value
    query = (reader.load()
            .select("body", F.concat("message_id", F.lit("-out")).alias("message_id"), F.lit("Outage.Out").alias("message_type"))
            .coalesce(1).writeStream.format("sqlqueue").option("url", url).option("endpoint", q).option("destination", out)
            .options(**writer_options).option("checkpointLocation", checkpoint)
            .trigger(processingTime="100 milliseconds").start())
    query._url = url
    return query


def _sent_ids(pg: Backend, out: str) -> list[str]:
    with pg.connect() as c:
        return [r[0] for r in c.execute(f"SELECT headers::json->>'NServiceBus.MessageId' FROM {pg.q(out)} ORDER BY seq")]


def _state(pg: Backend, q: str, out: str, e: str, n: int) -> str:
    got = set(_sent_ids(pg, out))
    missing = sorted({f"m{i:04d}-out" for i in range(n)} - got)
    with pg.connect() as c:
        claimed = [r[0] for r in c.execute("SELECT headers::json->>'NServiceBus.MessageId' FROM "
                                           f"{pg.q(pg.claims(q))} ORDER BY 1")]
    return (f"out={len(got)} queue={_count(pg, q)} staged={_count(pg, chr(34) + q + '.Staging' + chr(34))} "
            f"error={_count(pg, e)} missing={missing[:3]}..{missing[-3:]} claimed={len(claimed)}: {claimed[:3]}..")


def _terminate_every_session(pg: Backend) -> int:
    with pg.connect() as c:
        return len(c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE application_name = 'spark-qtransport' AND pid <> pg_backend_pid()").fetchall())


def test_a_stream_rides_through_outages_and_fails_with_one_line_past_the_bound(
        spark: Any, alive: Any, names: Any, tmp_path: Any) -> None:
    pg = Backend(alive.url)
    q, out, e = pg.create_queue(names("Outage")), pg.create_queue(names("OutageOut")), pg.create_queue(names("error"))
    n = 300
    pg.send_many(q, [(nsb_headers(f"m{i:04d}"), b"x" * 200) for i in range(n)])
    checkpoint = str(tmp_path / "checkpoint")
    query = _pipeline(spark, alive.url, q, out, e, checkpoint, outageTimeout="90s")
    try:
        _until(lambda: _count(pg, out) >= 50, 120, "the first messages", query)
        alive.crash()  # whatever the stream was doing: claiming, reading, staging, dispatching, acknowledging
        time.sleep(5)
        alive.start()
        _until(lambda: _count(pg, out) >= 150, 120, "messages after the restart", query)
        assert _terminate_every_session(pg) >= 1
        try:
            _until(lambda: _count(pg, out) >= n, 120, "every message", query)
        except AssertionError as exc:
            got = set(_sent_ids(pg, out))
            sorted(set(f"m{i:04d}-out" for i in range(n)) - got)
            raise AssertionError(f"{exc}\n{_state(pg, q, out, e, n)}") from None
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    ids = _sent_ids(pg, out)
    expected = [f"m{i:04d}-out" for i in range(n)]
    assert len(ids) == len(set(ids)) == n, "exactly once"
    assert ids == expected, "in the order they were sent"

    # past the bound: one line naming the database and the bound; the next run finishes the work
    pg.send_many(q, [(nsb_headers(f"p{i:04d}"), b"y" * 200) for i in range(50)])
    query = _pipeline(spark, alive.url, q, out, e, checkpoint, outageTimeout="3s")
    try:
        _until(lambda: _count(pg, out) >= n + 50, 120, "the second run", query)
        alive.crash()
        started = time.monotonic()
        with pytest.raises(Exception) as failed:
            query.awaitTermination(120)
        took = time.monotonic() - started
    finally:
        query.stop()
        alive.start()
    text = str(failed.value)
    print("PAST THE BOUND:", text)
    err = unwrap(failed.value)
    assert isinstance(err, DatabaseError), text[:2000]
    assert "option 'outageTimeout'" in err.message and "(3 s)" in err.message, err
    assert f"127.0.0.1:{alive.port}" in err.message, err
    assert took < 60
    pg.send_many(q, [(nsb_headers(f"r{i:04d}"), b"z" * 200) for i in range(30)])
    query = _pipeline(spark, alive.url, q, out, e, checkpoint)
    try:
        _until(lambda: _count(pg, out) >= n + 80, 120, "the run after the failure", query)
    finally:
        query.stop()
    ids = _sent_ids(pg, out)
    assert len(ids) == len(set(ids)) == n + 80
    assert pg.unheld(q) == 0 and _count(pg, e) == 0


def _arm_sleep(pg: Backend, table: str, tag: str) -> None:
    """The first connector statement that inserts into `table` sleeps (the server is killed then).
    Only in this life of the server: crash recovery may lose the sequence's first value (its WAL
    was not flushed), and the retried statement must not sleep again."""
    with pg.connect() as c:
        (life,) = c.execute("SELECT pg_postmaster_start_time()::text").fetchone()
        c.execute(f"CREATE SEQUENCE sleep_seq_{tag}")
        c.execute(f"CREATE FUNCTION sleep_fn_{tag}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                  "IF current_setting('application_name') = 'spark-qtransport' "
                  f"AND pg_postmaster_start_time() = '{life}'::timestamptz "
                  f"AND nextval('public.sleep_seq_{tag}') = 1 THEN PERFORM pg_sleep(60); END IF; RETURN NULL; END $$")
        c.execute(f"CREATE TRIGGER sleep_{tag} AFTER INSERT ON {pg.q(table)} FOR EACH STATEMENT "
                  f"EXECUTE FUNCTION sleep_fn_{tag}()")


def _sleeping(pg: Backend) -> bool:
    try:
        with pg.connect() as c:
            return bool(c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                                  "AND application_name = 'spark-qtransport'").fetchone()[0])
    except Exception:  # noqa: BLE001 - down
        return False


@pytest.mark.parametrize("phase", ["staging", "dispatch"])
def test_the_sink_rides_through_a_server_killed_while_it(spark: Any, alive: Any, names: Any, tmp_path: Any,
                                                         phase: str) -> None:
    """Staging: tasks that stage (inlineBytes 0) stage again from the rows they kept. Dispatch:
    the tasks handed their messages to the driver (the default below inlineBytes), which writes
    them again. (A batch staged before the server restarts and dispatched after cannot ride
    through: a crash empties the UNLOGGED staging table; the dispatch fails naming it, and the
    restarted query stages the batch again.)"""
    pg = Backend(alive.url)
    q, out, e = pg.create_queue(names("Sink")), pg.create_queue(names("SinkOut")), pg.create_queue(names("error"))
    n = 120
    pg.send_many(q, [(nsb_headers(f"m{i:04d}"), b"x" * 100) for i in range(20)])
    checkpoint = str(tmp_path / "checkpoint")
    query = _pipeline(spark, alive.url, q, out, e, checkpoint, outageTimeout="60s",
                      inlineBytes="0" if phase == "staging" else str(2**28))
    try:
        _until(lambda: _count(pg, out) >= 20, 120, "the first batch (it creates the staging table)", query)
        _arm_sleep(pg, f'"{q}.Staging"' if phase == "staging" else out, names.tag)
        pg.send_many(q, [(nsb_headers(f"m{i:04d}"), b"x" * 100) for i in range(20, n)])
        _until(lambda: _sleeping(pg), 120, f"a connector session sleeping in {phase}", query)
        alive.crash()
        time.sleep(5)
        alive.start()
        _until(lambda: _count(pg, out) >= n, 180, "every message", query)
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    ids = _sent_ids(pg, out)
    assert ids == [f"m{i:04d}-out" for i in range(n)], "exactly once, in order"
    assert _count(pg, f'"{q}.Staging"') == 0


def test_metrics_serve_up_0_during_an_outage_and_recover(alive: Any, names: Any) -> None:
    from test_metrics import Exporter, value

    pg = Backend(alive.url)
    q = pg.create_queue(names("Watched"))
    pg.send(q, nsb_headers("w1"), b"{}")
    exporter = Exporter(alive.url, "--cache-seconds", "0")
    try:
        assert value(exporter.scrape(), "sqlqueue_up") == 1
        alive.crash()
        down = [exporter.scrape(), exporter.scrape()]  # each within the scrape's own two attempts
        assert [value(s, "sqlqueue_up") for s in down] == [0, 0]
        alive.start()
        deadline = time.monotonic() + 30
        while value(up := exporter.scrape(), "sqlqueue_up") != 1:
            assert time.monotonic() < deadline, "the exporter reads the database again"
            time.sleep(0.5)
        assert value(up, "sqlqueue_queue_messages", queue=f'"public"."{q}"') == 1
    finally:
        err = exporter.stop()
    assert "Traceback" not in err


def test_stats_watch_waits_through_an_outage_and_says_so(alive: Any, names: Any) -> None:
    """`sqlqueue stats --watch` across a server killed and started again: no refresh fails, the
    refreshes go on afterwards, and stderr holds the outage's two lines (declared, over), nothing else."""
    import json
    import signal
    import subprocess
    import sys

    pg = Backend(alive.url)
    q = pg.create_queue(names("Watched"))
    pg.send(q, nsb_headers("w1"), b"{}")
    proc = subprocess.Popen([sys.executable, "-m", "spark_qtransport.cli", "stats", q, "--watch", "0.2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SQLQUEUE_URL": alive.url, "SQLQUEUE_OUTAGE_TIMEOUT": "60s",
                                 "PYTHONUNBUFFERED": "1"})
    refreshes: list[float] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            assert json.loads(line)["queues"][0]["messages"] == 1
            refreshes.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _until(lambda: len(refreshes) >= 2, 60, "the first refreshes", None)
        alive.crash()
        time.sleep(3)
        alive.start()
        restarted = time.monotonic()
        _until(lambda: bool(refreshes) and refreshes[-1] > restarted, 60, "a refresh after the restart", None)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    said = err.splitlines()
    assert len(said) == 2, err
    assert said[0].startswith("warning: ") and "1 min" in said[0] and "outageTimeout" in said[0], err
    assert said[1].startswith("info: ") and "answers again, after" in said[1], err
