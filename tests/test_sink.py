"""The sink in real Spark streaming queries: writeStream.format("sqlqueue") and QueueSink.

Queue -> Spark -> queues on the embedded PostgreSQL, with real checkpoints; outputs are read
back with NServiceBus's receive SQL and parsed as flat string maps.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, nsb_headers
from processes import wardens_of_this_process
from spark_qtransport import OutboxConflictError, QueueNotFoundError, QueueSink, publish, reply, unwrap
from spark_qtransport.spark.versions import capabilities
from spark_qtransport.wire import H

pytestmark = pytest.mark.usefixtures("spark")

#: Spark 4.0/4.1: no admission control (a run's first batch takes all that waits, see test_versions)
ADMISSION = capabilities().admission_control


def source(spark: Any, pg: Backend, queue: str, error: str, **options: str) -> Any:
    r = spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue).option("errorQueue", error)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def finish(query: Any, timeout: float = 180) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


def drained(query: Any) -> Any:
    """Run a stream (a processing-time trigger) until it has processed what is there, then stop it
    (its last batch is acknowledged at the trigger that found nothing new, or by its warden)."""
    query.processAllAvailable()
    query.stop()
    assert query.exception() is None, query.exception()
    return query


@pytest.fixture
def endpoint(pg: Backend, names: Any) -> Any:
    class E:
        sales = pg.create_queue(names("Sales"))  # our input queue: requests arrive here
        web = pg.create_queue(names("Web"))  # the requester: replies go here
        billing = pg.create_queue(names("Billing"))  # subscribed to OrderAccepted
        reminders = pg.create_queue(names("Reminders"))  # deferred follow-ups
        error = pg.create_queue(names("error"))
        subscriptions = names("SubscriptionRouting")

    return E


def handler(received: Any, e: Any, pg: Backend, *, delay: float = 1.0) -> Any:
    """Each request -> a reply, a deferred follow-up and a published event."""
    from pyspark.sql import functions as F

    body = F.to_json(F.struct(F.col("message_id").alias("order")))
    replies = received.select(*reply(body=body, message_type="Shop.Messages.OrderAccepted, Shop.Messages"))
    follow_ups = received.select(
        body.alias("body"),
        F.lit(e.reminders).alias("destination"),
        F.lit("Sales.Messages.CheckPayment").alias("message_type"),
        F.lit(delay).alias("delay"),
        F.concat(F.col("message_id"), F.lit("-reminder")).alias("message_id"),
    )
    events = received.select(*publish(body=body, message_type="Sales.Events.OrderAccepted, Sales.Events"))
    return replies.unionByName(follow_ups, allowMissingColumns=True).unionByName(events, allowMissingColumns=True)


def subscribe(pg: Backend, table: str, queue: str, topic: str) -> None:
    with pg.connect() as c:
        c.execute(f'CREATE TABLE IF NOT EXISTS "{table}" (QueueAddress varchar(200) NOT NULL, '
                  "Endpoint varchar(200) NOT NULL, Topic varchar(200) NOT NULL, PRIMARY KEY (Endpoint, Topic))")
        c.execute(f'INSERT INTO "{table}" VALUES (%s, %s, %s)', (queue, "Billing", topic))


@pytest.mark.compat
def test_endpoint_replies_defers_and_publishes_exactly_once(spark: Any, pg: Backend, endpoint: Any, checkpoint: str) -> None:
    e = endpoint
    subscribe(pg, e.subscriptions, e.billing, "Sales.Events.OrderAccepted")
    web_address = pg.dialect.format_address(pg.address(e.web))
    requests = {f"order-{i}": nsb_headers(f"order-{i}", **{H.REPLY_TO_ADDRESS: web_address}) for i in range(200)}
    pg.send_many(e.sales, [(h, b"{}") for h in requests.values()])
    out = handler(source(spark, pg, e.sales, e.error, maxMessagesPerTrigger="60"), e, pg)
    query = (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", e.sales)
             .option("subscriptionTable", e.subscriptions).option("createQueues", "true")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish(query)
    sent_at = time.monotonic()

    replies = pg.drain(e.web)
    assert sorted(h[H.CORRELATION_ID] for h, _ in replies) == sorted(requests)
    for h, body in replies:
        request = requests[h[H.CORRELATION_ID]]
        assert h[H.MESSAGE_INTENT] == "Reply"
        assert h[H.RELATED_TO] == request[H.MESSAGE_ID]
        assert h[H.CONVERSATION_ID] == request[H.CONVERSATION_ID]
        assert h[H.ENCLOSED_MESSAGE_TYPES] == "Shop.Messages.OrderAccepted, Shop.Messages"
        assert h[H.ORIGINATING_ENDPOINT] == e.sales
        assert h[H.REPLY_TO_ADDRESS] == pg.dialect.format_address(pg.address(e.sales))
        assert json.loads(body) == {"order": h[H.CORRELATION_ID]}
    events = pg.drain(e.billing)
    assert sorted(json.loads(b)["order"] for _, b in events) == sorted(requests)
    assert {h[H.MESSAGE_INTENT] for h, _ in events} == {"Publish"}
    assert len({h[H.MESSAGE_ID] for h, _ in events}) == 200

    # the follow-ups are due a second after their batch; a reader of our queue moves them
    # (every trigger), so they arrive within one trigger interval plus a second, not a minute
    assert pg.count(e.reminders) < 200
    mover = (source(spark, pg, e.sales, e.error).writeStream.format("noop")
             .option("checkpointLocation", checkpoint + "-mover").trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while pg.count(e.reminders) < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        arrived = time.monotonic() - sent_at
    finally:
        mover.stop()
    reminders = pg.drain(e.reminders)
    assert sorted(h[H.MESSAGE_ID] for h, _ in reminders) == sorted(f"{r}-reminder" for r in requests)
    assert all(H.FORWARD_DESTINATION not in h for h, _ in reminders)
    assert arrived < 15, f"delayed messages took {arrived:.1f}s"
    assert pg.count(e.sales) == 0 and pg.count(f'"{e.sales}.Staging"') == 0 and pg.count(f'"{e.sales}.Delayed"') == 0


def test_delayed_table_option_is_where_the_sink_stores_and_the_reader_moves_from(
    spark: Any, pg: Backend, endpoint: Any, checkpoint: str, names: Any,
) -> None:
    """`delayedTable` on the sink and on a reader of the endpoint's queue: deferred messages are
    stored in that table (no `<endpoint>.Delayed` is made) and the reader's triggers move them."""
    from pyspark.sql import functions as F

    e, deferred = endpoint, names("Deferred")
    pg.send_many(e.sales, [(nsb_headers(f"order-{i}"), b"{}") for i in range(3)])
    out = source(spark, pg, e.sales, e.error, delayedTable=deferred).select(
        F.lit("{}").alias("body"), F.lit(e.reminders).alias("destination"), F.lit("Sales.CheckPayment").alias("message_type"),
        F.lit(3.0).alias("delay"), F.concat(F.col("message_id"), F.lit("-reminder")).alias("message_id"))
    query = (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", e.sales)
             .option("delayedTable", deferred).option("createQueues", "true")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish(query)
    assert pg.count(deferred) + pg.count(e.reminders) == 3
    with pg.connect() as c:
        assert c.execute("SELECT to_regclass(%s)", (f'"public"."{e.sales}.Delayed"',)).fetchone() == (None,)
    mover = (source(spark, pg, e.sales, e.error, delayedTable=deferred).writeStream.format("noop")
             .option("checkpointLocation", checkpoint + "-mover").trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while pg.count(e.reminders) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        mover.stop()
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(e.reminders)) == [f"order-{i}-reminder" for i in range(3)]
    assert pg.count(deferred) == 0


@pytest.mark.compat
def test_foreach_batch_parquet_and_queues_stay_exactly_once_on_replay(
    spark: Any, pg: Backend, endpoint: Any, checkpoint: str, tmp_path: Path,
) -> None:
    """Parquet (overwritten per batch id) plus QueueSink in one foreachBatch; the driver dies in the
    last batch after both wrote (and the machine with it: no warden finishes the batch), so the next
    run replays that batch with its rows: neither output gets anything twice."""
    from pyspark.sql import functions as F

    e = endpoint
    pg.send_many(e.sales, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(90)])
    out = tmp_path / "parquet"
    sink = QueueSink(url=pg.url, endpoint=e.sales, destination=e.billing)
    calls: list[tuple[int, int]] = []
    crash = [True]

    def both(batch: Any, batch_id: int) -> None:
        rows = batch.select("message_id").collect()
        calls.append((batch_id, len(rows)))
        batch.select("message_id").write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))
        sink(batch.select(F.col("body"), F.lit("Billing.Messages.Invoice").alias("message_type"),
                          F.concat(F.col("message_id"), F.lit("-invoice")).alias("message_id")), batch_id)
        if crash[0] and any(r.message_id == "m089" for r in rows):
            for p in wardens_of_this_process():
                p.kill()
            raise RuntimeError("the driver dies after the last batch's writes")

    def run(**trigger: Any) -> Any:
        return (source(spark, pg, e.sales, e.error, maxMessagesPerTrigger="40").writeStream.foreachBatch(both)
                .option("checkpointLocation", checkpoint).trigger(**trigger).start())

    failed = run(processingTime="100 milliseconds")
    with pytest.raises(Exception, match="the driver dies"):
        failed.awaitTermination(120)
    last = calls[-1][0]
    # 4.0/4.1: a run's first batch takes all that waits
    assert [b for b, _ in calls] == ([0, 1, 2] if ADMISSION else [0])
    crash[0] = False
    calls.clear()
    finish(run(availableNow=True))
    assert calls[0] == (last, 10 if ADMISSION else 90), "the batch the driver died in ran again, with its rows"
    ids = sorted(r.message_id for r in spark.read.parquet(str(out)).collect())
    assert ids == [f"m{i:03d}" for i in range(90)]
    invoices = sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(e.billing))
    assert invoices == [f"m{i:03d}-invoice" for i in range(90)]


def test_checkpoint_reset_with_a_reused_endpoint_fails_loudly(spark: Any, pg: Backend, endpoint: Any, checkpoint: str) -> None:
    from pyspark.sql import functions as F

    e = endpoint

    def start(ckpt: str) -> Any:
        out = source(spark, pg, e.sales, e.error).select("body", F.lit("Billing.Messages.Invoice").alias("message_type"))
        return (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", e.sales)
                .option("destination", e.billing).option("checkpointLocation", ckpt).trigger(availableNow=True).start())

    pg.send_many(e.sales, [(nsb_headers(f"a{i}"), b"{}") for i in range(5)])
    finish(start(checkpoint))
    shutil.rmtree(checkpoint)  # the checkpoint is deleted; the endpoint's outbox remembers batch 0
    pg.send_many(e.sales, [(nsb_headers(f"b{i}"), b"{}") for i in range(5)])
    with pytest.raises(Exception) as failed:
        start(checkpoint).awaitTermination(180)
    err = unwrap(failed.value)
    assert isinstance(err, OutboxConflictError), failed.value
    assert err.queue == f'"public"."{e.sales}.Outbox"' and "sinkName" in err.message, err  # the option to set
    assert pg.count(e.billing) == 5  # only the first run's messages; nothing skipped silently...
    # ...the second run's are still held, not lost (4.0/4.1: and the first run's one batch, which the
    # new checkpoint took over: it is acknowledged only when its own next batch is planned)
    assert pg.held(e.sales) == (5 if ADMISSION else 10)


def test_bad_input_columns_fail_at_start_and_name_the_column(spark: Any, pg: Backend, endpoint: Any, checkpoint: str) -> None:
    from pyspark.sql import functions as F

    df = source(spark, pg, endpoint.sales, endpoint.error).select("body", F.lit(1).alias("priority"))
    pg.send(endpoint.sales, nsb_headers("m1"), b"{}")
    # Spark creates the writer when the query thread starts: the query stops before any batch
    with pytest.raises(Exception, match="unknown column.*'priority'"):
        df.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", endpoint.sales).option(
            "checkpointLocation", checkpoint).start().awaitTermination(120)
    with pytest.raises(Exception, match="option 'endpoint' is required"):
        df.select("body").writeStream.format("sqlqueue").option("url", pg.url).option(
            "checkpointLocation", checkpoint + "2").start().awaitTermination(120)
    # Spark planned the first batch before the writer failed: the message is held, not lost
    assert pg.count(endpoint.sales) + pg.count(f'"{endpoint.sales}.Claims"') == 1
    with pytest.raises(Exception, match="unknown option.*'destinaton'"):
        QueueSink(url=pg.url, endpoint=endpoint.sales, destinaton="x")


@pytest.mark.compat
def test_a_failed_batch_sends_nothing_and_its_poison_waits_with_it(
    spark: Any, pg: Backend, endpoint: Any, checkpoint: str,
) -> None:
    """'Sending from the error path' and 'failure happens after send': a batch whose send fails
    (a destination is missing, and so is the sink's error queue that would take its message)
    sends none of its messages, and the poison message claimed with it waits with its claim (never
    delivered: it reaches the error queue with its batch's acknowledgement); once the sink's
    error queue exists, the batch goes out once, the undeliverable message to it, and the poison
    message to the reader's error queue."""
    from pyspark.sql import functions as F

    e = endpoint
    missing, sink_errors = e.billing + "_later", e.error + "_sink"
    pg.send_many(e.sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(10)])
    pg.send(e.sales, "<corrupted headers", b"poison")

    def start() -> Any:
        out = source(spark, pg, e.sales, e.error).select(
            "body", F.lit("Billing.Messages.Invoice").alias("message_type"),
            F.when(F.col("message_id") == "m3", F.lit(missing)).otherwise(F.lit(e.billing)).alias("destination"))
        return (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", e.sales)
                .option("errorQueue", sink_errors)
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    with pytest.raises(Exception) as failed:
        start().awaitTermination(180)
    err = unwrap(failed.value)
    assert isinstance(err, QueueNotFoundError), failed.value
    assert (err.option, err.queue) == ("errorQueue", f'"public"."{sink_errors}"'), err
    assert pg.count(e.billing) == 0
    assert pg.count(e.error) == 0 and pg.held(e.sales) == 11  # all claimed, none acknowledged
    pg.create_queue(sink_errors)
    finish(start())
    if not ADMISSION:  # AvailableNow is the replayed batch alone; the poison moves at the next start
        finish(start())
    assert pg.count(e.billing) == 9
    [(_, headers, _)] = pg.rows(sink_errors)
    assert json.loads(headers)["NServiceBus.FailedQ"] == f'"public"."{missing}"'
    assert [b for _, _, b in pg.rows(e.error)] == [b"poison"]
    assert pg.held(e.sales) == 0


@pytest.mark.compat
def test_two_queue_sinks_in_one_batch_need_their_own_sink_names(spark: Any, pg: Backend, endpoint: Any, checkpoint: str) -> None:
    """The second call with the same sink name would look like a replay to the outbox: refused,
    never skipped. With its own sinkName each call is sent once."""
    from pyspark.sql import functions as F

    e = endpoint
    pg.send_many(e.sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(5)])

    def run(first: QueueSink, second: QueueSink, ckpt: str) -> Any:
        def both(batch: Any, batch_id: int) -> None:
            out = batch.select("body", F.lit("Billing.Messages.Invoice").alias("message_type"))
            first(out, batch_id)
            second(out.withColumn("destination", F.lit(e.reminders)), batch_id)

        return (source(spark, pg, e.sales, e.error).writeStream.foreachBatch(both)
                .option("checkpointLocation", ckpt).trigger(availableNow=True).start())

    same = QueueSink(url=pg.url, endpoint=e.sales, destination=e.billing)
    with pytest.raises(Exception, match="called twice in batch 0"):
        run(same, QueueSink(url=pg.url, endpoint=e.sales), checkpoint).awaitTermination(180)
    assert pg.count(e.reminders) == 0
    # the failed batch's messages are still held; a new checkpoint sends them under another
    # endpoint (the first endpoint's outbox remembers batch 0 of the failed run's query)
    finish(run(QueueSink(url=pg.url, endpoint=e.web, destination=e.billing),
               QueueSink(url=pg.url, endpoint=e.web, sinkName="reminders"), checkpoint + "-2"))
    assert pg.count(e.billing) == 5 + 5 and pg.count(e.reminders) == 5


@pytest.mark.compat
def test_stream_writer_replay_after_deleting_the_last_commit_sends_nothing_twice(
    spark: Any, pg: Backend, endpoint: Any, checkpoint: str,
) -> None:
    from pyspark.sql import functions as F

    e = endpoint
    pg.send_many(e.sales, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(70)])

    def run(**trigger: Any) -> Any:
        out = source(spark, pg, e.sales, e.error, maxMessagesPerTrigger="30").select(
            "body", F.lit("Billing.Messages.Invoice").alias("message_type"),
            F.concat(F.col("message_id"), F.lit("-invoice")).alias("message_id"))
        return (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", e.sales)
                .option("destination", e.billing).option("checkpointLocation", checkpoint)
                .trigger(**trigger).start())

    first = drained(run(processingTime="100 milliseconds"))
    last = max(p["batchId"] for p in first.recentProgress if p["numInputRows"])
    for name in (str(last), f".{last}.crc"):
        (Path(checkpoint) / "commits" / name).unlink()
    again = run(availableNow=True)
    finish(again)
    # the batch runs again; its claims were acknowledged at the trigger after Spark committed it,
    # so it reads nothing (a replay with its rows, after a crash, is the outbox's: test_crash_send)
    assert last in [p["batchId"] for p in again.recentProgress], "the last batch ran again"
    ids = sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(e.billing))
    assert ids == [f"m{i:03d}-invoice" for i in range(70)]
