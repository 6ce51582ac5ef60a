"""A row the sink cannot build into a message never stops the endpoint: it goes, as the message it
would have been, to the sink's error queue with NServiceBus's failure headers, exactly once with
its batch, and the rest is sent (option invalidRows=error-queue, the default); invalidRows=fail
fails the batch naming the column and the message (for a reply, the message it answers). Values
documented as accepted are: a deliver_at in the past, however far, is due now; a year-month
interval is refused when the query starts, naming the column."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, Sender, nsb_headers
from processes import wardens_of_this_process
from spark_qtransport import QueueSink, reply, unwrap
from spark_qtransport.errors import ConfigError, MessageError, QueueNotFoundError
from spark_qtransport.options.parse import WriterOptions
from spark_qtransport.wire import H

TYPE = "Shop.Messages.OrderAccepted, Shop.Messages"
MESSAGE = "NServiceBus.ExceptionInfo.Message"


def finish(query: Any, timeout: float = 180) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


def failure(headers: dict[str, str]) -> tuple[str, str, str]:
    return headers[H.FAILED_Q], headers["NServiceBus.ExceptionInfo.ExceptionType"], headers[MESSAGE]


@pytest.fixture
def queues(pg: Backend, names: Any) -> Any:
    class Q:
        sales = pg.create_queue(names("Sales"))  # the endpoint's input queue: requests arrive here
        web = pg.create_queue(names("Web"))  # the requester: replies go here
        billing = pg.create_queue(names("Billing"))
        error = pg.create_queue(names("error"))  # the reader's error queue
        sink_error = pg.create_queue(names("sinkerror"))  # the sink's

    return Q


@pytest.mark.usefixtures("spark")
def test_replies_with_a_nan_delay_go_to_the_error_queue_once_and_the_rest_is_sent(
    spark: Any, pg: Backend, queues: Any, checkpoint: str,
) -> None:
    """100 requests; the replies to 3 of them get a NaN delay (computed from the message). The
    97 others arrive once; the 3 are in the sink's error queue as the replies they would have
    been, with failure headers naming `delay`, the value and the request. The batch that holds
    them, replayed under its batch id, writes nothing twice. With invalidRows=fail the query
    fails instead, naming the column and the request the reply answers."""
    from pyspark.sql import functions as F

    q = queues
    web = pg.dialect.format_address(pg.address(q.web))
    bad = {"order-85", "order-90", "order-97"}  # all in the last batch (40 + 40 + 20)
    pg.send_many(q.sales, [(nsb_headers(f"order-{i}", **{H.REPLY_TO_ADDRESS: web}), b"{}") for i in range(100)])

    def start(ckpt: str, trigger: dict[str, Any] | None = None, **options: str) -> Any:
        received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q.sales)
                    .option("errorQueue", q.error).option("maxMessagesPerTrigger", "40").load())
        body = F.to_json(F.struct(F.col("message_id").alias("order")))
        replies = received.select(
            *reply(body=body, message_type=TYPE),
            F.when(F.col("message_id").isin(*bad), F.lit(float("nan"))).alias("delay"),
        )
        writer = (replies.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q.sales)
                  .option("errorQueue", q.sink_error).option("checkpointLocation", ckpt))
        for k, v in options.items():
            writer = writer.option(k, v)
        return writer.trigger(**(trigger or {"availableNow": True})).start()

    # the query stops as soon as the sink has dispatched the last batch (its 3 error copies), before
    # the next trigger (3 s) acknowledges it, and its warden goes with the machine: the batch stays
    # claimed, and the next run replays it with its rows (its commit deleted, if Spark wrote it)
    first = start(checkpoint, {"processingTime": "3 seconds"})
    deadline = time.monotonic() + 120
    while pg.count(q.sink_error) < 3:
        assert time.monotonic() < deadline and first.exception() is None, first.exception()
        time.sleep(0.05)
    for p in wardens_of_this_process():
        p.kill()
    first.stop()
    assert pg.held(q.sales) == 20, "the last batch is still claimed"
    last = max(int(p.name) for p in (Path(checkpoint) / "offsets").glob("[0-9]*"))
    for name in (str(last), f".{last}.crc"):  # the last batch runs again, under its batch id
        (Path(checkpoint) / "commits" / name).unlink(missing_ok=True)
    again = start(checkpoint)
    finish(again)
    assert [(p["batchId"], p["numInputRows"]) for p in again.recentProgress if p["numInputRows"]] == [(last, 20)]

    replies = pg.drain(q.web)
    assert sorted(h[H.RELATED_TO] for h, _ in replies) == sorted(f"order-{i}" for i in range(100) if f"order-{i}" not in bad)
    copies = {h[H.RELATED_TO]: (h, body) for h, body in pg.drain(q.sink_error)}
    assert sorted(copies) == sorted(bad)  # each once, though its batch ran twice
    for request, (h, body) in copies.items():
        failed_q, exception_type, message = failure(h)
        assert failed_q == web  # where the reply was going: a retry delivers it there
        assert exception_type == "spark_qtransport.MessageError"
        assert h["NServiceBus.ExceptionInfo.Data.Column"] == "delay"
        assert f"reply to message '{request}'" in message and "nan" in message  # the request it answers
        assert h["NServiceBus.ProcessingEndpoint"] == q.sales and h["NServiceBus.ProcessingMachine"]
        assert h[H.TIME_OF_FAILURE].endswith(" Z")
        # the reply it would have been: its body, intent, type and conversation
        assert json.loads(body) == {"order": request}
        assert (h[H.MESSAGE_INTENT], h[H.ENCLOSED_MESSAGE_TYPES], h[H.CORRELATION_ID]) == ("Reply", TYPE, request)
    assert pg.count(q.error) == 0 and pg.count(f'"{q.sales}.Staging"') == 0

    # invalidRows=fail: the batch fails, nothing of it is sent, and the error names the request
    pg.send_many(q.sales, [(nsb_headers(f"order-{i}", **{H.REPLY_TO_ADDRESS: web}), b"{}") for i in (85, 100, 101)])
    with pytest.raises(Exception) as info:
        start(checkpoint + "-strict", invalidRows="fail", sinkName="strict").awaitTermination(180)
    err = unwrap(info.value)
    assert isinstance(err, MessageError), info.value
    assert err.column == "delay" and "'order-85'" in err.message, err
    assert pg.count(q.web) == 0 and pg.count(q.sink_error) == 0


@pytest.mark.usefixtures("spark")
def test_queue_sink_sends_invalid_rows_to_the_error_queue_and_past_deliver_at_at_once(
    spark: Any, pg: Backend, queues: Any, checkpoint: str,
) -> None:
    """QueueSink in foreachBatch: two rows holding a NUL in a header go to the error queue (the
    NUL escaped in the copy, which can be written); deliver_at in year 1 and in 1900 is due now:
    the other eight arrive at once, nothing is left in the delayed table."""
    from pyspark.sql import functions as F

    q = queues
    pg.send_many(q.sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(10)])
    sink = QueueSink(url=pg.url, endpoint=q.sales, destination=q.billing, errorQueue=q.sink_error, createQueues=True)

    def handle(batch: Any, batch_id: int) -> None:
        nul = F.when(F.col("message_id").isin("m3", "m7"), F.lit("a\x00b")).otherwise(F.lit("ok"))
        year = F.when(F.col("message_id").isin("m0", "m2", "m4"), F.lit(1)).otherwise(F.lit(1900))
        sink(batch.select(
            "body", F.lit("Billing.Messages.Invoice").alias("message_type"),
            F.concat(F.col("message_id"), F.lit("-invoice")).alias("message_id"),
            F.create_map(F.lit("Shop.Note"), nul).alias("headers"),
            F.make_timestamp(year, F.lit(1), F.lit(1), F.lit(0), F.lit(0), F.lit(0)).alias("deliver_at"),
        ), batch_id)

    finish(spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q.sales)
           .option("errorQueue", q.error).load().writeStream.foreachBatch(handle)
           .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    sent = sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.billing))
    assert sent == sorted(f"m{i}-invoice" for i in range(10) if i not in (3, 7))
    assert pg.count(f'"{q.sales}.Delayed"') == 0
    copies = {h[H.MESSAGE_ID]: h for h, _ in pg.drain(q.sink_error)}
    assert sorted(copies) == ["m3-invoice", "m7-invoice"]
    for message_id, h in copies.items():
        assert h["Shop.Note"] == "a\\x00b"
        assert h["NServiceBus.ExceptionInfo.Data.Column"] == "headers"
        message = failure(h)[2]
        assert "headers['Shop.Note']" in message and f"'{message_id}'" in message
        assert "'a\\x00b'" in message  # the value, its NUL escaped
        assert H.FORWARD_DESTINATION not in h


def test_deliver_at_in_year_1_and_1900_is_delivered_at_once(pg: Backend, queues: Any) -> None:
    # its own error queue: create_queues would otherwise make the default `error` for every test after
    s = Sender(pg, queues.sales, destination=queues.billing, error_queue=queues.sink_error, create_queues=True)
    result = s.send([{"body": b"{}", "message_type": TYPE, "message_id": f"d{i}", "deliver_at": at} for i, at in enumerate(
        [datetime(1, 1, 1, tzinfo=timezone.utc), datetime(1900, 1, 1), datetime.now(timezone.utc) - timedelta(minutes=1)])])
    assert result.delayed == 3 and result.moved is not None and result.moved.moved == 3  # moved after the dispatch
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(queues.billing)) == ["d0", "d1", "d2"]


def test_a_batch_of_invalid_rows_is_one_warning_and_a_missing_error_queue_fails_it(
    pg: Backend, queues: Any, names: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [{"body": b"{}", "message_type": TYPE, "message_id": f"i{i}", "intent": "shout"} for i in range(3)]
    s = Sender(pg, queues.sales, error_queue=queues.sink_error)
    with caplog.at_level(logging.WARNING, logger="spark_qtransport.send"):
        result = s.send(rows, batch_id=0)
    assert result.invalid == 3 and pg.count(queues.sink_error) == 3
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "batch 0" in line and "3 rows" in line
    assert "'intent'" in line and "'i0'" in line and "'shout'" in line  # the first row's column, message, value
    # no error queue to take them: the batch fails, naming the option; nothing is lost or sent
    gone = Sender(pg, queues.sales, error_queue=names("missing"), destination=queues.billing, sink="gone")
    with pytest.raises(QueueNotFoundError, match="^error_queue: queue "):
        gone.send([*rows, {"body": b"{}", "message_type": TYPE}], batch_id=0)
    assert pg.count(queues.billing) == 0 and gone.staged() == 0


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("column", ["delay", "time_to_be_received"])
def test_a_year_month_interval_is_refused_naming_the_column(spark: Any, pg: Backend, queues: Any, column: str) -> None:
    """Spark's year-month intervals have no length in seconds: refused when the sink checks its
    input, before any task runs (they failed in Arrow conversion, `KeyError: 21`)."""
    from pyspark.sql import functions as F

    df = spark.range(1).select(F.lit("{}").alias("body"), F.lit(TYPE).alias("message_type"),
                               F.expr("INTERVAL '1' MONTH").alias(column))
    with pytest.raises(Exception) as info:
        df.write.format("sqlqueue").option("url", pg.url).option("endpoint", queues.sales) \
            .option("destination", queues.billing).mode("append").save()
    err = unwrap(info.value)
    assert isinstance(err, MessageError) and err.column == column, info.value
    assert "interval month" in err.message
    assert "KeyError" not in str(info.value)
    assert pg.count(queues.billing) == 0


def test_the_invalid_rows_option() -> None:
    base = {"url": "postgresql://u@h/db", "endpoint": "Sales"}
    assert WriterOptions.parse(base).invalid_rows == "error-queue"
    assert WriterOptions.parse({**base, "invalidRows": " FAIL "}).invalid_rows == "fail"
    with pytest.raises(ConfigError) as info:
        WriterOptions.parse({**base, "invalidrows": "skip"})
    assert info.value.option == "invalidRows"
    assert "'skip'" in str(info.value) and "error-queue" in str(info.value)
    with pytest.raises(ConfigError, match="option 'invalidRows'"):
        QueueSink(url="postgresql://u@h/db", endpoint="Sales", invalidRows="drop")


def test_fail_names_the_message_id_else_the_request_else_a_generated_id(pg: Backend, queues: Any) -> None:
    s = Sender(pg, queues.sales, destination=queues.billing, invalid_rows="fail")
    with pytest.raises(MessageError, match=r"column 'delay' of message 'm1': inf is not a finite") as info:
        s.stage([{"body": b"{}", "message_type": TYPE, "message_id": "m1", "delay": float("inf")}], batch_id=0)
    assert info.value.column == "delay"
    with pytest.raises(MessageError, match=r"column 'delay' of the reply to message 'req-1' \(NServiceBus.RelatedTo\)"):
        s.stage([{"body": b"{}", "message_type": TYPE, "intent": "reply", "destination": queues.web, "delay": "soon",
                  "headers": {H.RELATED_TO: "req-1"}}], batch_id=0)
    with pytest.raises(MessageError, match=r"of message '[0-9a-f-]{36}' \(an id generated in this run"):
        s.stage([{"body": b"{}", "message_type": TYPE, "time_to_be_received": -1}], batch_id=0)
