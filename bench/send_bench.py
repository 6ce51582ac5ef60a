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

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import arguments, database, fill, nsb_receive_send, queue_to_queue, reset  # noqa: E402


def nsb_way(url: str, n: int, size: int, connections: int) -> float:
    """Receive one, send one, commit: SendsAtomicWithReceive, one message per transaction."""
    reset(url, "BenchNsbIn", "BenchNsbOut", endpoints=("BenchNsb",))
    fill(url, "BenchNsbIn", n, size)
    return nsb_receive_send(url, "BenchNsbIn", "BenchNsbOut", n, connections)


def connector(spark, url: str, n: int, size: int, per_trigger: int, tag: str = "Bench") -> dict:  # type: ignore[no-untyped-def]
    src, out = f"{tag}In", f"{tag}Out"
    reset(url, src, out, "error", endpoints=(src,))
    fill(url, src, n, size)
    return queue_to_queue(spark, url, src, out, n, per_trigger)


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
