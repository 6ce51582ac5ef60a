"""fail() and retry_later(): a received message the pipeline rejects is moved to the sink's error
queue, or retried later through delayed delivery, as NServiceBus's recoverability does (same
MessageId, headers and body; failure headers from `wire.failure_headers`; Retries counted), exactly
once with its batch like any message the sink sends."""

from __future__ import annotations

import json
import math
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from backends import Backend, Sender, nsb_headers
from spark_qtransport import QueueSink, fail, retry_later
from spark_qtransport.errors import ConfigError
from spark_qtransport.spark.writer import RUN_ID_PROPERTY
from spark_qtransport.transport.sending.messages import check_columns
from spark_qtransport.wire import H, format_time, host_id, parse_time

EXCEPTION_TYPE, EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.ExceptionType", "NServiceBus.ExceptionInfo.Message"
STACK_TRACE, SOURCE = "NServiceBus.ExceptionInfo.StackTrace", "NServiceBus.ExceptionInfo.Source"


def finish(query: Any, timeout: float = 120) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


@pytest.fixture
def queues(pg: Backend, names: Any) -> Any:
    class Q:
        sales = pg.create_queue(names("Sales"))  # the endpoint's input queue
        billing = pg.create_queue(names("Billing"))  # where accepted orders go
        error = pg.create_queue(names("error"))  # the reader's error queue
        sink_error = pg.create_queue(names("sinkerror"))  # the sink's: fail() sends here

    return Q


def received(spark: Any, pg: Backend, q: Any, **options: str) -> Any:
    r = spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q.sales).option("errorQueue", q.error)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def requests(pg: Backend, q: Any, n: int) -> dict[str, tuple[dict[str, str], bytes]]:
    """n NServiceBus messages in Sales that were retried before (Retries, FLRetries), with a header
    of their own and a body that is not text."""
    sent = {}
    for i in range(n):
        headers = nsb_headers(f"order-{i}", **{H.RETRIES: "2", H.FL_RETRIES: "1", "Shop.Tenant": f"t{i}",
                                                 H.RETRIES_TIMESTAMP: format_time(datetime.now(timezone.utc))})
        sent[f"order-{i}"] = (headers, bytes([0, 255, i, 10, 13]) + f"order {i}".encode())
    pg.send_many(q.sales, list(sent.values()))
    return sent


def sink_and_replay(sink: QueueSink, out: Any, batch: Any, batch_id: int) -> None:
    """`sink` the batch's rows, then the same batch again, as a restarted run replays it (a new run id)."""
    sink(out, batch_id)
    sc = batch.sparkSession.sparkContext
    run = sc.getLocalProperty(RUN_ID_PROPERTY)
    sc.setLocalProperty(RUN_ID_PROPERTY, str(uuid.uuid4()))
    try:
        sink(out, batch_id)
    finally:
        sc.setLocalProperty(RUN_ID_PROPERTY, run)


def assert_failed(pg: Backend, q: Any, h: dict[str, str], original: dict[str, str], endpoint: str) -> None:
    """`h`: the error copy of `original`, received from Sales by a sink of `endpoint`."""
    assert h[H.FAILED_Q] == pg.dialect.format_address(pg.address(q.sales))  # the address syntax, as ReplyToAddress
    assert h[H.PROCESSING_ENDPOINT] == endpoint and h[H.PROCESSING_MACHINE]
    assert h[H.HOST_ID] == host_id(endpoint) and h[H.HOST_DISPLAY_NAME] == h[H.PROCESSING_MACHINE]
    failed_at = parse_time(h[H.TIME_OF_FAILURE])
    assert failed_at is not None and abs((datetime.now(timezone.utc) - failed_at).total_seconds()) < 120
    assert H.RETRIES not in h and H.FL_RETRIES not in h and H.FORWARD_DESTINATION not in h
    # every other header as received, untouched
    kept = {k: v for k, v in original.items() if k not in (H.RETRIES, H.FL_RETRIES)}
    assert {k: h[k] for k in kept} == kept


@pytest.mark.usefixtures("spark")
def test_fail_moves_rejected_messages_to_the_error_queue_as_nservicebus_does(
    spark: Any, pg: Backend, queues: Any, checkpoint: str,
) -> None:
    """A pipeline accepts even orders (sent on to Billing) and rejects odd ones with fail(): each
    rejected message is in the sink's error queue once, with the same MessageId, headers and body
    and every failure header; the reason is a column computed per row."""
    from pyspark.sql import functions as F

    q = queues
    sent = requests(pg, q, 10)
    orders = received(spark, pg, q)
    odd = F.substring_index(F.col("message_id"), "-", -1).cast("int") % 2 == 1
    rejected = orders.where(odd).select(*fail(
        reason=F.concat(F.lit("order "), F.col("message_id"), F.lit(" has no lines")),
        exception_type="Shop.InvalidOrderException", stack_trace=F.lit("at Shop.Validate()\nat Shop.Handle()"),
    ))
    accepted = orders.where(~odd).select("body", F.lit(q.billing).alias("destination"),
                                         F.lit("Billing.Messages.Invoice").alias("message_type"))
    query = (accepted.unionByName(rejected, allowMissingColumns=True).writeStream.format("sqlqueue")
             .option("url", pg.url).option("endpoint", q.sales).option("errorQueue", q.sink_error)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish(query)

    assert sorted(body for _, body in pg.drain(q.billing)) == sorted(sent[f"order-{i}"][1] for i in (0, 2, 4, 6, 8))
    rows = pg.rows(q.sink_error)
    copies = {h[H.MESSAGE_ID]: (h, body) for h, body in pg.drain(q.sink_error)}
    assert len(rows) == 5 and sorted(copies) == [f"order-{i}" for i in (1, 3, 5, 7, 9)]
    for message_id, (h, body) in copies.items():
        original, original_body = sent[message_id]
        assert body == original_body  # byte for byte
        assert_failed(pg, q, h, original, q.sales)
        assert h[EXCEPTION_TYPE] == "Shop.InvalidOrderException"
        assert h[EXCEPTION_MESSAGE] == f"order {message_id} has no lines"
        assert h[STACK_TRACE] == "at Shop.Validate()\nat Shop.Handle()"
        assert h[SOURCE] == "spark_qtransport.pipeline"
    assert pg.count(q.error) == 0 and pg.unheld(q.sales) == 0


@pytest.mark.usefixtures("spark")
def test_a_replayed_batch_through_queue_sink_sends_its_error_copies_once(
    spark: Any, pg: Backend, queues: Any, checkpoint: str,
) -> None:
    """QueueSink in foreachBatch sends the batch's fail() rows; the same batch id of the same
    query again (a restarted run replaying it: a new run id) sends nothing more. The reason may
    be NULL (an empty message); the exception type defaults to spark_qtransport.ProcessingFailed."""
    from pyspark.sql import functions as F

    q = queues
    sent = requests(pg, q, 6)
    sink = QueueSink(url=pg.url, endpoint=q.sales, errorQueue=q.sink_error)
    replayed = []

    def handle(batch: Any, batch_id: int) -> None:
        out = batch.select(*fail(reason=F.when(F.col("message_id") != "order-0", F.col("message_id"))))
        sink_and_replay(sink, out, batch, batch_id)
        replayed.append(batch_id)

    finish(received(spark, pg, q).writeStream.foreachBatch(handle).option("checkpointLocation", checkpoint)
           .trigger(availableNow=True).start())
    assert replayed
    copies = {h[H.MESSAGE_ID]: (h, body) for h, body in pg.drain(q.sink_error)}
    assert sorted(copies) == sorted(sent)  # each once
    for message_id, (h, body) in copies.items():
        assert body == sent[message_id][1]
        assert_failed(pg, q, h, sent[message_id][0], q.sales)
        assert h[EXCEPTION_TYPE] == "spark_qtransport.ProcessingFailed"
        assert h[EXCEPTION_MESSAGE] == ("" if message_id == "order-0" else message_id)
        assert h[STACK_TRACE] == ""


@pytest.mark.usefixtures("spark")
def test_only_what_succeeded_is_audited_and_forwarded(spark: Any, pg: Backend, queues: Any, names: Any,
                                                      checkpoint: str) -> None:
    """NServiceBus audits (and forwards) a message only once its handler succeeded. A reader with
    auditQueue and forwardTo, a foreachBatch whose QueueSink fails two orders and retries one,
    each batch's sink call made twice (a replay): the failed orders are in the error queue once and
    never audited or forwarded; the retried one is audited once, when its second receive
    succeeds; every other order once."""
    from pyspark.sql import functions as F

    q = queues
    audit, forward = pg.create_queue(names("audit")), pg.create_queue(names("forward"))
    sent = requests(pg, q, 6)  # each has Retries 2: one delayed retry left
    sink = QueueSink(url=pg.url, endpoint=q.sales, errorQueue=q.sink_error)

    def handle(batch: Any, batch_id: int) -> None:
        rejected = F.col("message_id").isin("order-1", "order-3")
        retried = (F.col("message_id") == "order-2") & (F.col("headers")[H.RETRIES] != "3")
        out = (batch.where(~rejected & ~retried).select("body", F.lit(q.billing).alias("destination"),
                                                         F.lit("Billing.Invoice").alias("message_type"))
               .unionByName(batch.where(rejected).select(*fail(reason="no lines")), allowMissingColumns=True)
               .unionByName(batch.where(retried).select(*retry_later(reason="busy", delay=0)), allowMissingColumns=True))
        sink_and_replay(sink, out, batch, batch_id)

    for _ in range(3):  # the retry comes back after the first run; each run acknowledges the one before
        finish(received(spark, pg, q, auditQueue=audit, forwardTo=forward, endpoint="Sales.Spark")
               .writeStream.foreachBatch(handle).option("checkpointLocation", checkpoint)
               .trigger(availableNow=True).start())
    succeeded = ["order-0", "order-2", "order-4", "order-5"]
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.sink_error)) == ["order-1", "order-3"]
    audited = [h for h, _ in pg.drain(audit)]
    assert sorted(h[H.MESSAGE_ID] for h in audited) == succeeded  # each once
    assert [h[H.RETRIES] for h in audited if h[H.MESSAGE_ID] == "order-2"] == ["3"]  # its second, successful receive
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(forward)) == succeeded
    assert pg.count(q.billing) == 4 and pg.unheld(q.sales) == 0
    with pg.connect() as c:
        assert c.execute(f'SELECT count(*) FROM "{q.sales}.Claims"').fetchone()[0] == 0, "every claim acknowledged"
    assert sorted(sent) == sorted([*succeeded, "order-1", "order-3"])


@pytest.mark.usefixtures("spark")
def test_retry_later_retries_three_times_at_growing_delays_then_fails(
    spark: Any, pg: Backend, queues: Any, checkpoint: str,
) -> None:
    """A pipeline that rejects a message every time: it comes back three times, with Retries 1,
    2, 3, each no earlier than delay x attempt after the previous arrival (delay 1 s), then goes
    to the error queue with failure headers and without Retries."""
    q = queues
    original = nsb_headers("order-1", **{"Shop.Tenant": "t1"})
    body = b"\x00\x01 order"
    pg.send(q.sales, original, body)
    Sender(pg, q.sales, error_queue=q.sink_error, create_queues=True)  # the delayed table, before the reader looks
    sink = QueueSink(url=pg.url, endpoint=q.sales, errorQueue=q.sink_error)
    arrivals: list[tuple[float, dict[str, str]]] = []

    def handle(batch: Any, batch_id: int) -> None:
        at = time.monotonic()
        for row in batch.select("message_id", "headers", "body").collect():
            assert row.message_id == "order-1" and bytes(row.body) == body
            arrivals.append((at, dict(row.headers)))
        sink(batch.select(*retry_later(reason="the database is down", exception_type="Shop.DatabaseDown", delay=1)),
             batch_id)

    query = (received(spark, pg, q).writeStream.foreachBatch(handle).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while pg.count(q.sink_error) == 0 and time.monotonic() < deadline and query.isActive:
            time.sleep(0.1)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()

    assert [h.get(H.RETRIES) for _, h in arrivals] == [None, "1", "2", "3"]
    for attempt in (1, 2, 3):
        (before, _), (at, h) = arrivals[attempt - 1], arrivals[attempt]
        assert at - before >= attempt * 1.0, (attempt, at - before)
        stamp = parse_time(h[H.RETRIES_TIMESTAMP])
        assert stamp is not None and abs((datetime.now(timezone.utc) - stamp).total_seconds()) < 60
        assert h[H.MESSAGE_ID] == "order-1" and H.FORWARD_DESTINATION not in h
        assert {k: h[k] for k in original} == original
    [(h, copy)] = pg.drain(q.sink_error)
    assert copy == body
    assert_failed(pg, q, h, original, q.sales)
    assert H.RETRIES_TIMESTAMP in h  # kept, as MoveToError keeps it
    assert (h[EXCEPTION_TYPE], h[EXCEPTION_MESSAGE]) == ("Shop.DatabaseDown", "the database is down")
    assert pg.unheld(q.sales) == 0 and pg.count(f'"{q.sales}.Delayed"') == 0


def retry_row(q: Any, message_id: str, headers: dict[str, str], **failure: Any) -> dict[str, Any]:
    """A retry_later() row as the sink's tasks get it."""
    return {"body": b"{}", "message_id": message_id, "headers": headers, "intent": "retry", "destination": q.sales,
            "failure": {"exception_type": None, "message": "down", "stack_trace": None, "failed_q": q.sales,
                        "max_retries": 3, "delay": 10.0, **failure}}


def test_retries_stop_a_day_after_the_last_one_and_count_from_the_header(pg: Backend, queues: Any) -> None:
    """A Retries.Timestamp more than 24 h old sends the message to the error queue at once
    (HasReachedMaxTime: the last delayed retry's time); 23 h is retried. An unreadable Retries
    counts as none (int.TryParse), so it is attempt 1, 10 s later."""
    q = queues
    now = datetime.now(timezone.utc)
    s = Sender(pg, q.sales, error_queue=q.sink_error, create_queues=True)
    result = s.send([
        retry_row(q, "old", nsb_headers("old", **{H.RETRIES: "1", H.RETRIES_TIMESTAMP: format_time(now - timedelta(hours=25))})),
        retry_row(q, "recent", nsb_headers("recent", **{H.RETRIES: "1", H.RETRIES_TIMESTAMP: format_time(now - timedelta(hours=23))})),
        retry_row(q, "odd", nsb_headers("odd", **{H.RETRIES: "two"})),
        retry_row(q, "spent", nsb_headers("spent", **{H.RETRIES: "0"}), max_retries=0),
    ])
    assert result.delayed == 2 and result.invalid == 0
    copies = {h[H.MESSAGE_ID]: h for h, _ in pg.drain(q.sink_error)}
    assert sorted(copies) == ["old", "spent"]
    assert H.RETRIES not in copies["old"] and copies["old"][EXCEPTION_MESSAGE] == "down"
    assert copies["old"][EXCEPTION_TYPE] == "spark_qtransport.ProcessingFailed"
    with pg.connect() as c:
        stored = [(json.loads(text), due) for text, due in c.execute(f'SELECT headers, due FROM "{q.sales}.Delayed"')]
    delayed = {h[H.MESSAGE_ID]: (h, due) for h, due in stored}
    assert sorted(delayed) == ["odd", "recent"]
    assert delayed["recent"][0][H.RETRIES] == "2" and delayed["odd"][0][H.RETRIES] == "1"
    for h, _ in delayed.values():
        assert h[H.FORWARD_DESTINATION] == pg.dialect.format_address(pg.address(q.sales))
    wait = {k: (due - now).total_seconds() for k, (_, due) in delayed.items()}
    assert 15 < wait["recent"] < 25 and 5 < wait["odd"] < 15  # 10 s x attempt


def test_invalid_retry_values_are_refused_naming_the_argument(pg: Backend, queues: Any) -> None:
    """Literals are refused when the columns are made; per-row values go the invalid-rows way:
    to the error queue as the received message, the message naming the field."""
    for bad in ({"delay": -1}, {"delay": float("nan")}, {"delay": math.inf}, {"max_retries": -1},
                {"max_retries": 1.5}):
        [(name, value)] = bad.items()
        with pytest.raises(ConfigError, match=rf"retry_later\({name}="):
            retry_later("down", **bad)
    q = queues
    s = Sender(pg, q.sales, error_queue=q.sink_error)
    result = s.send([retry_row(q, "m1", nsb_headers("m1"), delay=float("nan")),
                     retry_row(q, "m2", nsb_headers("m2"), max_retries=-2)])
    assert result.invalid == 2
    copies = {h[H.MESSAGE_ID]: h for h, _ in pg.drain(q.sink_error)}
    for message_id, field, shown in (("m1", "failure.delay", "nan"), ("m2", "failure.max_retries", "whole")):
        assert copies[message_id]["NServiceBus.ExceptionInfo.Data.Column"] == "failure"
        text = copies[message_id][EXCEPTION_MESSAGE]
        assert f"'{field}'" in text and f"'{message_id}'" in text and shown in text, text  # the field, message, why
    assert copies["m1"][H.FAILED_Q] == pg.dialect.format_address(pg.address(q.sales))
    assert copies["m1"][H.ENCLOSED_MESSAGE_TYPES] == nsb_headers("x")[H.ENCLOSED_MESSAGE_TYPES]
    # a failure column that is not the helpers' struct is refused when the query starts
    with pytest.raises(ConfigError, match="column 'failure' has type"):
        check_columns([("body", "binary"), ("failure", "string")])
    with pytest.raises(ConfigError, match="field 'delay' has type string"):
        check_columns([("body", "binary"), ("failure", "struct<message:string,delay:string>")])
    check_columns([("body", "binary"), ("failure", "struct<message:string,delay:decimal(10,2),max_retries:int>")])


def servicecontrol_retry(pg: Backend, error_queue: str) -> int:
    """Do what ServicePulse's "retry" does (ServiceControl's ReturnToSender): take each failed
    message out of the error queue, remove the retry counters, FailedQ, TimeOfFailure and the
    exception headers, add the retry's unique id and acknowledgement queue (the error queue), and
    put it back into its FailedQ. Returns how many were retried."""
    ack_queue = pg.dialect.format_address(pg.address(error_queue))
    moved = 0
    for headers, body in pg.drain(error_queue):
        if H.FAILED_Q not in headers:
            continue
        failed_q = headers[H.FAILED_Q]
        back = {k: v for k, v in headers.items()
                if not k.startswith(("NServiceBus.Retries", "NServiceBus.ExceptionInfo."))
                and k not in (H.FAILED_Q, H.TIME_OF_FAILURE, H.FL_RETRIES)}
        back[H.RETRY_UNIQUE_MESSAGE_ID] = str(uuid.uuid4())
        back[H.RETRY_ACK_QUEUE] = ack_queue
        pg.send(failed_q, back, body)
        moved += 1
    return moved


@pytest.mark.usefixtures("spark")
def test_a_servicepulse_retry_of_a_failed_message_is_processed_and_acknowledged_once(
    spark: Any, pg: Backend, queues: Any, names: Any, tmp_path: Any,
) -> None:
    """fail() -> the error queue -> a ServicePulse retry back into FailedQ -> received again and
    processed -> one acknowledgement control message in the acknowledgement queue, and the audit
    copy says it was sent; a restart sends no second one."""
    from pyspark.sql import functions as F

    q = queues
    audit = pg.create_queue(names("audit"))
    sent = requests(pg, q, 4)
    checkpoint = str(tmp_path / "ckpt")

    def run(reject: bool) -> None:
        orders = received(spark, pg, q, auditQueue=audit, endpoint="Sales.Spark")
        out = (orders.select(*fail(reason="not yet")) if reject else
               orders.select("body", F.lit(q.billing).alias("destination"), F.lit("Billing.Invoice").alias("message_type")))
        finish(out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q.sales)
               .option("errorQueue", q.sink_error).option("checkpointLocation", checkpoint + str(reject))
               .option("sinkName", "rejects" if reject else "accepts")
               .trigger(availableNow=True).start())

    run(reject=True)
    assert pg.count(q.sink_error) == 4
    assert servicecontrol_retry(pg, q.sink_error) == 4 and pg.count(q.sales) == 4
    run(reject=False)
    run(reject=False)  # a restart: nothing new, nothing acknowledged twice
    acks = [h for h, body in pg.drain(q.sink_error)]
    assert len(acks) == 4 and all(h[H.CONTROL_MESSAGE] == "True" and parse_time(h[H.RETRY_SUCCESSFUL]) for h in acks)
    assert len({h[H.RETRY_UNIQUE_MESSAGE_ID] for h in acks}) == 4
    assert pg.count(q.billing) == 4 and pg.unheld(q.sales) == 0
    audited = [h for h, _ in pg.drain(audit)]
    retried = [h for h in audited if H.RETRY_UNIQUE_MESSAGE_ID in h]
    assert len(audited) == 4 and len(retried) == 4  # the first receive failed: not audited, as NServiceBus
    assert all(h[H.RETRY_ACK_SENT] == "true" for h in retried)
    assert {h[H.RETRY_UNIQUE_MESSAGE_ID] for h in retried} == {h[H.RETRY_UNIQUE_MESSAGE_ID] for h in acks}
    assert sorted({h[H.MESSAGE_ID] for h in audited}) == sorted(sent)
