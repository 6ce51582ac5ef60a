"""An endpoint pipeline, as a template to copy: receive orders, validate, keep, reply, publish, defer.

For every micro-batch of messages received on the endpoint's queue (``--queue``, default Sales):

- ``Shop.Messages.PlaceOrder`` whose JSON body has an ``OrderId`` and a positive ``Amount`` is
  accepted: appended to a Delta table, answered with an ``OrderAccepted`` reply to its sender,
  announced with a published ``Sales.Events.OrderPlaced`` event (to the queues subscribed to it in
  SubscriptionRouting), and followed by a ``PaymentReminder`` deferred to this endpoint itself;
- a ``PaymentReminder`` coming back when due is recorded in the same Delta table;
- anything else (invalid orders, unknown message types) goes to the error queue with NServiceBus's
  failure headers (FailedQ, ExceptionInfo.*), which ``sqlqueue error retry`` understands.

Delta and the queues are each written exactly once per batch (Delta ``txnAppId``/``txnVersion``;
the connector's outbox), so a crash and a replay of the batch change nothing.

The part to edit is "The handler" below: plain DataFrame functions from received messages to
rows. The rest is plumbing.

    python jobs/endpoint.py --url postgresql://... --table /data/sales --checkpoint /data/ckpt/sales
    spark-submit --properties-file conf/spark-defaults.conf --conf spark.jars.ivy=$PWD/.cache/ivy \\
        --py-files dist/spark_qtransport-*.whl jobs/endpoint.py --config conf/endpoint.toml
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _config  # noqa: E402
from _stops import STOPS  # noqa: E402

# ----------------------------------------------------------------------------------------------
# The handler: edit this part.
# ----------------------------------------------------------------------------------------------

PLACE_ORDER = "Shop.Messages.PlaceOrder"
ORDER_ACCEPTED = "Shop.Messages.OrderAccepted, Shop.Messages"
ORDER_PLACED = "Sales.Events.OrderPlaced, Sales.Events"
PAYMENT_REMINDER = "Sales.Messages.PaymentReminder, Sales.Messages"

ORDER_SCHEMA = "OrderId long, Amount double, Customer string"


def message_kind(type_column: Any) -> Any:
    """'order', 'reminder' or null (no handler), from NServiceBus.EnclosedMessageTypes."""
    from pyspark.sql import functions as F

    first = F.trim(F.split(F.coalesce(type_column, F.lit("")), "[,;]").getItem(0))
    return (F.when(first == PLACE_ORDER, "order")
            .when(first == PAYMENT_REMINDER.split(",")[0], "reminder"))


def handle(messages: Any) -> Any:
    """Received messages -> one row each: what the handler made of it (`outcome`, `problem`)."""
    from pyspark.sql import functions as F

    kind = message_kind(F.col("message_type"))
    body = F.from_json(F.col("body").cast("string"), ORDER_SCHEMA)
    problem = (
        F.when(kind.isNull(), F.concat(F.lit("no handler for message type "), F.coalesce("message_type", F.lit("(none)"))))
        .when((kind == "order") & body.isNull(), F.lit("order body is not JSON"))
        .when((kind == "order") & body["OrderId"].isNull(), F.lit("order has no OrderId"))
        .when((kind == "order") & ~(F.coalesce(body["Amount"], F.lit(0.0)) > 0), F.lit("order Amount must be positive"))
    )
    return messages.select(
        "*", kind.alias("kind"), body["OrderId"].alias("order_id"), body["Amount"].alias("amount"),
        body["Customer"].alias("customer"), problem.alias("problem"),
        F.when(problem.isNull(), F.lit("handled")).otherwise(F.lit("failed")).alias("outcome"),
    )


def table_rows(handled: Any) -> Any:
    """What the Delta table keeps: accepted orders and reminders that came back."""
    return handled.where("outcome = 'handled'").selectExpr(
        "message_id", "kind", "order_id", "amount", "customer", "conversation_id", "time_sent", "claimed_at",
        "to_date(coalesce(time_sent, claimed_at)) AS date",
    )


def outgoing(handled: Any, *, endpoint: str, reminder_delay: float) -> Any:
    """The messages to send: replies, events, reminders and error-queue copies of failures."""
    from pyspark.sql import functions as F

    from spark_qtransport import fail, publish, reply

    orders = handled.where("outcome = 'handled' AND kind = 'order'")
    order_body = F.to_json(F.struct(F.col("order_id").alias("OrderId"), F.col("amount").alias("Amount")))
    replies = orders.where("reply_to IS NOT NULL").select(*reply(body=order_body, message_type=ORDER_ACCEPTED))
    events = orders.select(*publish(body=order_body, message_type=ORDER_PLACED))
    reminders = orders.select(
        F.to_json(F.struct(F.col("order_id").alias("OrderId"))).alias("body"),
        F.lit(endpoint).alias("destination"), F.lit(PAYMENT_REMINDER).alias("message_type"),
        F.lit(float(reminder_delay)).alias("delay"),
        F.create_map(F.lit("NServiceBus.ConversationId"), F.col("conversation_id"),
                     F.lit("NServiceBus.RelatedTo"), F.col("message_id")).alias("headers"),
    )
    # to the sink's errorQueue as NServiceBus's recoverability moves them (`wire.failure_headers`)
    failures = handled.where("outcome = 'failed'").select(
        *fail(reason=F.col("problem"), exception_type="Sales.ValidationException"))
    out = replies
    for part in (events, reminders, failures):
        out = out.unionByName(part, allowMissingColumns=True)
    return out


# ----------------------------------------------------------------------------------------------
# Plumbing.
# ----------------------------------------------------------------------------------------------

DEFAULTS: dict[str, Any] = {
    "url": os.environ.get("SQLQUEUE_URL"),
    "queue": "Sales",
    "error_queue": "error",
    "table": _config.REQUIRED,
    "checkpoint": _config.REQUIRED,
    "trigger": "5s",
    "max_messages": 10_000,
    "reminder_delay": 3600.0,
    "subscription_table": "SubscriptionRouting",
    "job_id": "endpoint",
}

def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = _config.stream_parser(__doc__, trigger="5s", job_id="endpoint")
    p.add_argument("--queue", help="the endpoint's input queue; also its name when sending (default: Sales)")
    p.add_argument("--reminder-delay", type=float, help="seconds until an order's PaymentReminder (default 3600)")
    p.add_argument("--subscription-table", help="table routing published events (default: SubscriptionRouting)")
    return _config.parse(p, "endpoint", DEFAULTS, argv)


def batch_handler(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The foreachBatch function: Delta and the queues, each exactly once per batch id."""
    from spark_qtransport import QueueSink

    sink = QueueSink(url=args.url, endpoint=args.queue, errorQueue=args.error_queue,
                     subscriptionTable=args.subscription_table)

    from _spark import append_once

    def run(batch: Any, batch_id: int) -> None:
        handled = handle(batch).persist()
        try:
            append_once(table_rows(handled), batch_id, table=args.table, job_id=args.job_id)
            sink(outgoing(handled, endpoint=args.queue,
                          reminder_delay=args.reminder_delay), batch_id)
        finally:
            handled.unpersist()

    return run


def start(spark: Any, args: argparse.Namespace) -> Any:
    received = (spark.readStream.format("sqlqueue").option("url", args.url).option("queue", args.queue)
                .option("errorQueue", args.error_queue).option("maxMessagesPerTrigger", str(args.max_messages))
                .load())
    return (received.writeStream.foreachBatch(STOPS.gated(batch_handler(args))).option("checkpointLocation", args.checkpoint)
            .trigger(**_config.trigger(args.trigger)).queryName("endpoint").start())


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    from _spark import require_delta, session

    require_delta()

    spark = session("sqlqueue-endpoint")
    query = start(spark, args)
    print(f"endpoint {args.queue}: handling into {args.table} (checkpoint {args.checkpoint})", flush=True)
    from _progress import follow

    print(follow(query).outcome, flush=True)
    return 0


if __name__ == "__main__":
    _config.exit_with(main)
