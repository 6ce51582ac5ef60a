"""Receive benchmark: raw SQL baseline vs. the connector end to end, on a durable PostgreSQL.

Prints, in one run:
  1. the NServiceBus way: one receive transaction per message (its own SQL), one connection;
  2. raw SQL claim + read + ack without Spark (the connector's statements, driven from Python);
  3. connector end to end: queue -> Spark -> noop sink, Trigger.AvailableNow;
  4. the ratio of 3 to 2;
  5. the fixed cost of a micro-batch, from a run of tiny batches.

    python bench/receive_bench.py [--messages 200000] [--size 1024] [--per-trigger 50000]

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402
import psycopg  # noqa: E402
from _common import arguments, database, drain, fill, nsb_receive  # noqa: E402


def reset(url: str, *queues: str) -> None:
    _common.reset(url, *queues)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")


def nsb_one_row(url: str, n: int, size: int) -> float:
    reset(url, "BenchNsb", "error")
    fill(url, "BenchNsb", n, size)
    return nsb_receive(url, "BenchNsb", n)


def raw_claim_read_ack(url: str, n: int, size: int, per_trigger: int) -> float:
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving.receiver import Receiver, read_slice

    reset(url, "BenchRaw", "error")
    fill(url, "BenchRaw", n, size)
    r = Receiver(ReaderOptions.parse({"url": url, "queue": "BenchRaw", "numPartitions": "1"}))
    start = r.initial_offset()
    got = 0
    t = time.perf_counter()
    while True:
        end = r.latest(start, per_trigger)
        if end == start:
            break
        for part in r.slices(start, end):
            for _ in read_slice(part):
                got += 1
        r.ack(end)
        start = end
    dt = time.perf_counter() - t
    r.close()
    assert got == n, (got, n)
    return n / dt


def spark_e2e(spark, url: str, n: int, size: int, per_trigger: int, queue: str = "BenchSpark") -> dict:  # type: ignore[no-untyped-def]
    reset(url, queue, "error")
    fill(url, queue, n, size)
    return drain(spark, url, queue, n, per_trigger)


def main() -> int:
    args = arguments(__doc__).parse_args()
    with database(args) as url:
        nsb = nsb_one_row(url, args.nsb_messages, args.size)
        print(f"1. NServiceBus way (1 row / transaction, 1 connection):  {nsb:>10,.0f} msg/s  ({args.nsb_messages:,} msgs)")
        raw = raw_claim_read_ack(url, args.messages, args.size, args.per_trigger)
        print(f"2. raw SQL claim + read + ack, no Spark:                  {raw:>10,.0f} msg/s")

        from _spark import session

        spark = session("sqlqueue-bench")
        spark_e2e(spark, url, 2_000, args.size, 1_000, queue="BenchWarm")  # JVM and worker warm-up
        e2e = spark_e2e(spark, url, args.messages, args.size, args.per_trigger)
        print(f"3. connector end to end, queue -> Spark -> noop sink:     {e2e['wall_rate']:>10,.0f} msg/s wall clock"
              f" ({e2e['batches']} batches, first {e2e['first_batch_s']:.2f}s)")
        print(f"   ... counting micro-batch time only:                   {e2e['batch_rate']:>10,.0f} msg/s;"
              f" steady state {e2e['steady_rate']:,.0f} msg/s")
        print(f"4. ratio end to end / raw SQL:                            {e2e['wall_rate'] / raw:>10.2f}"
              f"   (micro-batch time only: {e2e['batch_rate'] / raw:.2f})")

        tiny = spark_e2e(spark, url, 600, 64, 10, queue="BenchTiny")
        reset(url, "BenchTiny", "error")
        tq_ms = 1000 * 600 / tiny["batch_rate"] / 60
        print(f"5. fixed cost per micro-batch (60 batches of 10):        {tq_ms:>10.0f} ms")
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
