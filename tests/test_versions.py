"""What differs between the Spark lines a Databricks runtime has (4.0 = 17.3 LTS, 4.1 = 18 LTS, 4.2 = 19,
4.3), shown on the running one: `Trigger.AvailableNow` drains what was there at its start, and a stopped
stream whose batches were all committed holds no claim after one restart. The compatibility runs
(tests/compat/run.py) run this file on every line; `make test` on the development pin."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_queues import fifo_and_once, produce
from test_stream import Collect, run_available_now

from backends import Backend
from spark_qtransport.spark.versions import capabilities

pytestmark = [pytest.mark.usefixtures("spark"), pytest.mark.compat]

SPARK = capabilities()


def stream(spark: Any, pg: Backend, queue: str, error: str, **options: str) -> Any:
    r = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue)
         .option("errorQueue", error).option("maxMessagesPerTrigger", "100"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def claims(pg: Backend, queues: str) -> int:
    """Claims held for `queues` (a comma-separated list), in their claim tables or by prepared claims."""
    return sum(pg.held(q) for q in queues.split(","))


def test_the_capabilities_are_those_of_the_line() -> None:
    line = tuple(int(p) for p in SPARK.line.split("."))
    assert SPARK.admission_control == (line >= (4, 2))
    assert SPARK.arrow_reads == (line >= (4, 2))
    assert SPARK.arrow_writes == (line >= (4, 1))
    assert SPARK.available_now == ("native" if line >= (4, 2) else "one batch")


def test_available_now_drains_what_was_there_at_its_start(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    """500 messages, maxMessagesPerTrigger 100: batches of 100 with admission control (4.2+); on
    4.0/4.1 Spark runs AvailableNow as one batch, and the first batch of a run takes all 500. The
    platform work happens at the acknowledgement: one audit copy each, once every batch is acked."""
    q, e = pg.create_queue(names("Sales"), nsb=True), pg.create_queue(names("error"))
    audit = pg.create_queue(names("audit"))
    produce(pg, q, 0, 500)
    sink = Collect()
    run_available_now(spark, stream(spark, pg, q, e, auditQueue=audit), checkpoint, sink)
    fifo_and_once(sink.ids(), {q: 500})
    sizes = [len(rows) for _, rows in sink.batches if rows]
    assert sizes == ([100] * 5 if SPARK.admission_control else [500])
    assert pg.count(q) == 0
    # a second run, nothing new: the last batch is acknowledged, nothing delivered again
    again = Collect()
    run_available_now(spark, stream(spark, pg, q, e, auditQueue=audit), checkpoint, again)
    assert again.rows == []
    assert claims(pg, q) == 0
    assert pg.count(audit) == 500


def test_a_stopped_stream_leaves_no_claims_after_one_restart(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    """A processingTime stream acknowledges its last batch within a trigger or two of Spark's
    commit while it idles (Spark's commit() of a batch comes only with the next one); stopped,
    it holds nothing, and a restart with nothing new delivers nothing."""
    q, e = pg.create_queue(names("Sales"), nsb=True), pg.create_queue(names("error"))
    sink = Collect()

    def received(n: int) -> None:
        deadline = time.monotonic() + 120
        while len(sink.ids()) < n and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)

    produce(pg, q, 0, 50)
    query = (stream(spark, pg, q, e).writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    received(50)  # the run's first batch
    produce(pg, q, 50, 250)  # then batches of at most 100 on every line
    received(300)
    deadline = time.monotonic() + 5  # a few idle triggers: the last batch acknowledged
    while claims(pg, q) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert claims(pg, q) == 0, "an idle stream acknowledges its last batch"
    query.stop()
    fifo_and_once(sink.ids(), {q: 300})
    restart = Collect()
    query = (stream(spark, pg, q, e).writeStream.foreachBatch(restart).option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    time.sleep(1.0)
    query.stop()
    assert restart.rows == []
    assert claims(pg, q) == 0


def test_several_queues_in_one_stream_with_a_restart(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    """Three queues by list: every message once and in FIFO order per queue, across two runs."""
    qs = [pg.create_queue(names(f"Q{i}"), nsb=True) for i in range(3)]
    e = pg.create_queue(names("error"))
    for q, n in zip(qs, (300, 40, 3), strict=True):
        produce(pg, q, 0, n)
    first = Collect()
    run_available_now(spark, stream(spark, pg, ",".join(qs), e), checkpoint, first)
    for q, n in zip(qs, (20, 0, 5), strict=True):
        produce(pg, q, 1000, n)
    second = Collect()
    run_available_now(spark, stream(spark, pg, ",".join(qs), e), checkpoint, second)
    fifo_and_once(first.ids() + second.ids(), {qs[0]: 320, qs[1]: 40, qs[2]: 8})
    assert sum(pg.count(q) for q in qs) == 0
    # 4.2+: an AvailableNow run acknowledges its last batch; 4.0/4.1 run it as one batch, which
    # the next run's start acknowledges
    assert claims(pg, ",".join(qs)) == (0 if SPARK.admission_control else 25)
    third = Collect()
    run_available_now(spark, stream(spark, pg, ",".join(qs), e), checkpoint, third)
    assert third.rows == []
    assert claims(pg, ",".join(qs)) == 0
