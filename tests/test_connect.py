"""The sink and the jobs' Delta append over Spark Connect (Databricks serverless and standard
access mode): no ``sparkContext`` on the client or in foreachBatch functions.

The Connect server and session are conftest's (`connect_server.py`). Each stream runs with availableNow, is stopped, gets more messages, runs again from its
checkpoint, and has its last batch replayed (its commit deleted): every message arrives once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport import QueueSink
from spark_qtransport.spark.versions import capabilities
from spark_qtransport.wire import H

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"

pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")


def source(spark: Any, pg: Backend, queue: str, error: str, **options: str) -> Any:
    return (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue)
            .option("errorQueue", error).option("maxMessagesPerTrigger", "20").options(**options).load())


def invoices(received: Any) -> Any:
    return received.selectExpr("body", "'Billing.Messages.Invoice' AS message_type",
                               "concat(message_id, '-invoice') AS message_id")


def finish(query: Any, timeout: float = 180) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


def across_a_restart_and_a_replay(pg: Backend, queue: str, checkpoint: str, run: Any) -> None:
    """Run, stop, send more, run again, then replay the last batch (its commit deleted)."""
    pg.send_many(queue, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(30)])
    run()
    pg.send_many(queue, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(30, 50)])
    run()
    commits = Path(checkpoint) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink()
    run()
    assert (commits / str(last)).exists(), "the last batch ran again"


@pytest.fixture
def queues(pg: Backend, names: Any) -> Any:
    class Q:
        sales = pg.create_queue(names("Sales"))
        billing = pg.create_queue(names("Billing"))
        error = pg.create_queue(names("error"))

    return Q


EXPECTED = [f"m{i:03d}-invoice" for i in range(50)]


def test_foreach_batch_queue_sink_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, names: Any,
                                                              checkpoint: str) -> None:
    """Over two queues in one stream (offsets with a position per queue), replay included."""
    q = queues
    returns = pg.create_queue(names("Returns"))
    pg.send_many(returns, [(nsb_headers(f"r{i:03d}"), b"{}") for i in range(5)])
    sink = QueueSink(url=pg.url, endpoint=q.sales, destination=q.billing)

    def run() -> None:
        finish(invoices(source(connect, pg, f"{q.sales}, {returns}", q.error)).writeStream.foreachBatch(sink)
               .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.billing)) == EXPECTED + [f"r{i:03d}-invoice" for i in range(5)]
    assert pg.count(q.sales) == 0 and pg.count(returns) == 0 and pg.count(f'"{q.sales}.Staging"') == 0


def test_stream_writer_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, names: Any,
                                                     checkpoint: str) -> None:
    """With the platform's helpers too: audit copies, and fail() for one message."""
    from spark_qtransport import fail

    q = queues
    audit, failed = pg.create_queue(names("audit")), pg.create_queue(names("failed"))

    def run() -> None:
        received = source(connect, pg, q.sales, q.error, auditQueue=audit)
        out = invoices(received).unionByName(received.where("message_id = 'm007'").select(*fail(reason="seven")),
                                             allowMissingColumns=True)
        finish(out.writeStream.format("sqlqueue")
               .option("url", pg.url).option("endpoint", q.sales).option("destination", q.billing)
               .option("errorQueue", failed).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.billing)) == EXPECTED
    assert [(h[H.MESSAGE_ID], h[H.EXCEPTION_MESSAGE]) for h, _ in pg.drain(failed)] == [("m007", "seven")]
    # m007 failed: not audited (the sink marked its claim), as NServiceBus audits only what succeeded
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(audit)) == [f"m{i:03d}" for i in range(50) if i != 7]


@pytest.mark.compat
def test_two_queue_sinks_with_one_name_are_refused_over_connect(connect: Any, pg: Backend, queues: Any, checkpoint: str) -> None:
    q = queues
    first, second = (QueueSink(url=pg.url, endpoint=q.sales, destination=q.billing) for _ in range(2))
    pg.send_many(q.sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])

    def both(batch: Any, batch_id: int) -> None:
        first(invoices(batch), batch_id)
        second(invoices(batch), batch_id)

    # pyspark 4.3's Connect foreachBatch session lists no active query (so QueueSink cannot tell
    # two calls in one batch apart): there the outbox refuses the second call instead
    refused = "called twice in batch 0" if capabilities().line != "4.3" else "(?s)already dispatched.*Nothing was sent"
    with pytest.raises(Exception, match=refused):
        (source(connect, pg, q.sales, q.error).writeStream.foreachBatch(both)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination(180))


def test_queue_to_delta_append_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, tmp_path: Path) -> None:
    sys.path.insert(0, str(JOBS))
    import queue_to_delta

    q, table, checkpoint = queues, str(tmp_path / "bronze"), str(tmp_path / "ckpt")

    query_ids = set()

    def run() -> None:
        query = (queue_to_delta.bronze(source(connect, pg, q.sales, q.error)).writeStream
                 .foreachBatch(queue_to_delta.delta_writer(table, "bronze-connect"))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        finish(query)
        query_ids.add(query.id)

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    rows = connect.read.format("delta").load(table).select("message_id").collect()
    assert sorted(r.message_id for r in rows) == [f"m{i:03d}" for i in range(50)]
    # every append is keyed by the job id and the checkpoint's query id (not a placeholder)
    commits = [json.loads(line) for f in sorted((Path(table) / "_delta_log").glob("*.json"))
               for line in f.read_text().splitlines()]
    assert {c["txn"]["appId"] for c in commits if "txn" in c} == {f"bronze-connect:{i}" for i in query_ids}
    assert len(query_ids) == 1
