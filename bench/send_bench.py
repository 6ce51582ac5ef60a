"""Queue -> Spark -> queue benchmark, exactly once, against the NServiceBus way, on a durable PostgreSQL.

Prints, in one run:
  1. the NServiceBus way with plain SQL: per message one transaction that receives one row (its
     receive SQL) and INSERTs one message into the output queue (its send SQL), on 1 and on 2
     connections (measured on a sample, --nsb-messages);
  2. the connector: queue -> Spark -> writeStream.format("sqlqueue") -> queue, Trigger.AvailableNow,
     every batch dispatched through the outbox;
  3. the ratios.

    python bench/send_bench.py [--messages 200000] [--size 1024] [--per-trigger 50000]

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import arguments, database, fill  # noqa: E402

NSB_RECEIVE = (
    'DELETE FROM "{0}" rs WHERE rs.id = (SELECT id FROM "{0}" ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) '
    "RETURNING rs.id, rs.headers, rs.body"
)
NSB_SEND = 'INSERT INTO "{0}" (id, expires, headers, body) VALUES (%s, NULL, %s, %s)'


def reset(url: str, endpoint: str, *queues: str) -> None:
    import psycopg

    from spark_qtransport.connections import parse_url
    from spark_qtransport.transport.operations.install import create_queues

    with psycopg.connect(url, autocommit=True) as c:
        for t in (*queues, *(f"{q}.Claims" for q in queues), *(f"{endpoint}.{s}" for s in ("Staging", "Outbox", "Delayed"))):
            c.execute(f'DROP TABLE IF EXISTS "{t}"')
    create_queues(parse_url(url), *queues)


def nsb_way(url: str, n: int, size: int, connections: int) -> float:
    """Receive one, send one, commit: SendsAtomicWithReceive, one message per transaction."""
    import uuid

    import psycopg

    reset(url, "BenchNsb", "BenchNsbIn", "BenchNsbOut")
    fill(url, "BenchNsbIn", n, size)
    counts = [0] * connections

    def worker(i: int) -> None:
        with psycopg.connect(url) as conn:
            while True:
                row = conn.execute(NSB_RECEIVE.format("BenchNsbIn")).fetchone()
                if row is None:
                    conn.commit()
                    return
                conn.execute(NSB_SEND.format("BenchNsbOut"), (uuid.uuid4(), row[1], row[2]))
                conn.commit()
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    assert sum(counts) == n, (counts, n)
    return n / dt


def connector(spark, url: str, n: int, size: int, per_trigger: int, tag: str = "Bench") -> dict:  # type: ignore[no-untyped-def]
    import psycopg
    from pyspark.sql import functions as F

    src, out = f"{tag}In", f"{tag}Out"
    reset(url, src, src, out, "error")
    fill(url, src, n, size)
    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    df = (
        spark.readStream.format("sqlqueue").option("url", url).option("queue", src)
        .option("maxMessagesPerTrigger", str(per_trigger)).load()
        .select("body", F.col("message_id"), F.col("message_type"), F.col("headers"))
    )
    t = time.perf_counter()
    q = (df.writeStream.format("sqlqueue").option("url", url).option("endpoint", src).option("destination", out)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination()
    wall = time.perf_counter() - t
    shutil.rmtree(ckpt, ignore_errors=True)
    with psycopg.connect(url) as c:
        got = c.execute(f'SELECT count(*), count(DISTINCT headers::json->>\'NServiceBus.MessageId\') FROM "{out}"').fetchone()
    assert got == (n, n), (got, n)
    busy = [p for p in q.recentProgress if p["numInputRows"]]
    trigger_ms = [p["durationMs"]["triggerExecution"] for p in busy]
    steady = sum(p["numInputRows"] for p in busy[1:]) / (sum(trigger_ms[1:]) / 1000) if len(busy) > 1 else float("nan")
    return {"wall_rate": n / wall, "steady_rate": steady, "batches": len(busy), "first_batch_s": trigger_ms[0] / 1000}


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--skip-nsb", action="store_true", help="measure the connector only")
    args = ap.parse_args()
    with database(args) as url:
        nsb1 = nsb2 = float("nan")
        if not args.skip_nsb:
            nsb1 = nsb_way(url, args.nsb_messages, args.size, 1)
            print(f"1. NServiceBus way, receive + send per transaction, 1 connection:  {nsb1:>9,.0f} msg/s")
            nsb2 = nsb_way(url, args.nsb_messages, args.size, 2)
            print(f"   ... 2 connections:                                              {nsb2:>9,.0f} msg/s")

        from _spark import session

        spark = session("sqlqueue-send-bench")
        connector(spark, url, 2_000, args.size, 1_000, tag="BenchWarm")  # JVM and worker warm-up
        r = connector(spark, url, args.messages, args.size, args.per_trigger)
        print(f"2. connector, queue -> Spark -> queue, exactly once:              {r['wall_rate']:>9,.0f} msg/s wall clock"
              f" ({r['batches']} batches, first {r['first_batch_s']:.2f}s)")
        print(f"   ... batches after the first:                                    {r['steady_rate']:>9,.0f} msg/s")
        print(f"3. ratio connector / NServiceBus way: {r['wall_rate'] / nsb1:.1f}x (1 connection),"
              f" {r['wall_rate'] / nsb2:.1f}x (2 connections)")
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
