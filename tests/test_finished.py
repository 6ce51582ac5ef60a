"""A batch is finished when Spark commits it: its messages are acknowledged (deleted, audited) within
a trigger interval of that commit whether or not new messages arrive, and within seconds of the
query's end; what the sink settled is never delivered again, to any query of the endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from backends import Backend, nsb_headers


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check()` held; fails naming `what` after `timeout`."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.fixture
def sales(pg: Backend, names: Any) -> Any:
    class Q:
        queue = pg.create_queue(names("Sales"))
        audit = pg.create_queue(names("audit"))
        billing = pg.create_queue(names("Billing"))
        error = pg.create_queue(names("error"))

    return Q


def orders_to_billing(spark: Any, pg: Backend, q: Any, checkpoint: str, *, trigger: str = "200 milliseconds") -> Any:
    """The Sales endpoint: each order received (audited) becomes an invoice sent to Billing."""
    from pyspark.sql import functions as F

    received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q.queue)
                .option("auditQueue", q.audit).option("errorQueue", q.error).load())
    invoices = received.select("body", F.lit(q.billing).alias("destination"),
                               F.lit("Billing.Messages.Invoice").alias("message_type"))
    return (invoices.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", q.queue)
            .option("checkpointLocation", checkpoint).trigger(processingTime=trigger).start())


@pytest.mark.usefixtures("spark")
def test_an_idle_stream_audits_its_last_batch_within_a_trigger_interval(
    spark: Any, pg: Backend, sales: Any, checkpoint: str,
) -> None:
    """Six orders, then nothing: the batch's audit copies are written and its claims deleted while
    the query runs on idle, not only when a next batch comes (Spark's commit() of a batch arrives
    with the next one)."""
    q = sales
    pg.send_many(q.queue, [(nsb_headers(f"order-{i}"), b'{"order": %d}' % i) for i in range(6)])
    query = orders_to_billing(spark, pg, q, checkpoint)
    try:
        wait_for("six invoices in Billing", lambda: pg.count(q.billing) == 6, 120)
        wait_for("six audit copies, no claim held", lambda: pg.count(q.audit) == 6 and pg.held(q.queue) == 0, 10)
        assert query.isActive and pg.count(q.queue) == 0
    finally:
        query.stop()
    assert pg.count(q.audit) == 6 and pg.count(q.billing) == 6
