"""The speed table: the connector against the NServiceBus way and against the floor, in one run on one database.

Every path gets a fresh queue of --messages messages with --size random bytes each (incompressible;
NServiceBus-shaped headers), filled by COPY, then VACUUM ANALYZE and CHECKPOINT before its clock
starts (as bench/phases.py does), so every path starts equal:

  1. NServiceBus receive: one row per transaction (its receive SQL), 1 connection;
  2. NServiceBus receive + send per transaction (SendsAtomicWithReceive), 2 connections;
  3. the floor: bench/phases.py's DELETE ... RETURNING of --per-trigger rows per transaction,
     fetched into Python (binary cursor), committed, until empty: at-least-once, no claim table;
  4. the connector draining the queue: queue -> Spark -> noop sink, Trigger.AvailableNow;
  5. the connector queue -> Spark -> queue, exactly once through the outbox, Trigger.AvailableNow;
for 4 and 5: steady state (the batches after the first: rows / their triggerExecution) and wall
clock (messages / start() to end). Then the fixed cost of a micro-batch (60 batches of 10 64-byte
messages: batch time / 60, as receive_bench.py measures it), and the latency from INSERT to output at
--rate msg/s (a producer thread inserts and commits one message at a time; a foreachBatch on the
driver notes when it sees each; latency = seen - commit returned, over --seconds after --warmup).
Last, the goals, each MET or NOT MET.

    python bench/speed.py [--messages 200000] [--per-trigger 50000] [--size 1024] [--json speed.json]

--nsb-messages N (default 20,000) runs the two NServiceBus paths on N messages: one row per transaction
drains a long queue ever slower (dead index entries pile up at its head faster than autovacuum
clears them), so a short queue gives the NServiceBus way its best rate, and the ratios are not flattered.

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    NSB_SEND,
    arguments,
    database,
    drain,
    drop,
    fill,
    floor,
    nsb_receive,
    nsb_receive_send,
    queue_to_queue,
    reset,
    settle,
)

#: the goals: drain steady >= 0.6 x floor, q->q steady >= 10 x NServiceBus (2 connections),
#: fixed cost <= 300 ms, p50 latency <= 1 s
GOAL_DRAIN_FLOOR, GOAL_QQ_NSB, GOAL_FIXED_MS, GOAL_P50_S = 0.6, 10.0, 300.0, 1.0


def fresh(url: str, queue: str, n: int, size: int, *also: str, endpoints: tuple[str, ...] = ()) -> None:
    """A new queue of n messages (random bodies) plus empty queues `also`; VACUUM ANALYZE, CHECKPOINT."""
    reset(url, queue, *also, endpoints=endpoints)
    if n:
        fill(url, queue, n, size, random_bodies=True)
    settle(url, queue)


def fixed_cost_ms(spark: Any, url: str) -> float:
    """Micro-batch time of 600 messages of 64 B read 10 per trigger, divided by the 60 batches."""
    fresh(url, "SpeedTiny", 600, 64, "error")
    r = drain(spark, url, "SpeedTiny", 600, 10)
    drop(url, "SpeedTiny")
    return sum(r["batch_ms"]) / r["batches"]


def latency(spark: Any, url: str, *, rate: float, warmup: float, seconds: float, size: int,
            trigger: str) -> dict[str, Any]:
    """INSERT -> foreachBatch on the driver, at `rate` messages a second, one per transaction."""
    import psycopg

    queue = "SpeedLatency"
    fresh(url, queue, 0, size, "error")
    sent: list[tuple[str, float]] = []  # (native id, wall time the commit returned)
    seen: dict[str, float] = {}

    def on_batch(df: Any, _batch_id: int) -> None:
        ids = [r[0] for r in df.select("native_id").collect()]
        now = time.time()
        for i in ids:
            seen.setdefault(i, now)

    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    q = (spark.readStream.format("sqlqueue").option("url", url).option("queue", queue).load()
         .writeStream.foreachBatch(on_batch).option("checkpointLocation", ckpt)
         .trigger(processingTime=trigger).start())
    stop = threading.Event()
    conversation = str(uuid.uuid4())

    def produce() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            tick = time.perf_counter()
            while not stop.is_set():
                mid = str(uuid.uuid4())
                headers = json.dumps({
                    "NServiceBus.MessageId": mid, "NServiceBus.MessageIntent": "Send",
                    "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages",
                    "NServiceBus.ContentType": "application/json", "NServiceBus.ConversationId": conversation,
                    "NServiceBus.OriginatingEndpoint": "Shop.Web", "NServiceBus.ReplyToAddress": "Shop.Web",
                })
                conn.execute(NSB_SEND.format(queue), (mid, headers, os.urandom(size)))  # autocommit: committed
                sent.append((mid, time.time()))
                tick += 1 / rate
                stop.wait(max(0.0, tick - time.perf_counter()))

    producer = threading.Thread(target=produce, daemon=True)
    try:
        while not q.lastProgress:  # the query has run its first (empty) batch
            time.sleep(0.05)
        producer.start()
        begin = time.time() + warmup
        end = begin + seconds
        time.sleep(max(0.0, end - time.time()))
        stop.set()
        producer.join()
        window = [(mid, t) for mid, t in sent if begin <= t < end]
        deadline = time.time() + 30
        while time.time() < deadline and not all(mid in seen for mid, _ in window):
            time.sleep(0.1)
    finally:
        stop.set()
        q.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    lat = sorted(seen[mid] - t for mid, t in window if mid in seen)
    drop(url, queue)
    if len(lat) < 2:
        return {"messages": len(window), "missing": len(window) - len(lat), "p50_s": float("nan"), "p90_s": float("nan")}
    deciles = statistics.quantiles(lat, n=10, method="inclusive")
    return {"messages": len(window), "missing": len(window) - len(lat), "p50_s": statistics.median(lat),
            "p90_s": deciles[8], "max_s": lat[-1], "min_s": lat[0]}


def run(args: Any, url: str) -> dict[str, Any]:
    n, size, k, nsb_n = args.messages, args.size, args.per_trigger, args.nsb_messages or args.messages
    fig: dict[str, Any] = {"messages": n, "size": size, "per_trigger": k, "nsb_messages": nsb_n}

    def step(what: str) -> float:
        print(f"  {what} ...", flush=True, file=sys.stderr)
        return time.perf_counter()

    t = step("NServiceBus receive, 1 connection")
    fresh(url, "SpeedNsb", nsb_n, size)
    fig["nsb_receive"] = nsb_receive(url, "SpeedNsb", nsb_n)
    drop(url, "SpeedNsb")

    step("NServiceBus receive + send, 2 connections")
    fresh(url, "SpeedNsbIn", nsb_n, size, "SpeedNsbOut")
    fig["nsb_receive_send_2"] = nsb_receive_send(url, "SpeedNsbIn", "SpeedNsbOut", nsb_n, 2)
    drop(url, "SpeedNsbIn", "SpeedNsbOut")

    step("floor")
    fresh(url, "SpeedFloor", n, size)
    fig["floor"] = floor(url, "SpeedFloor", n, k)
    drop(url, "SpeedFloor")

    step("Spark session and warm-up")
    from _spark import session

    spark = session("sqlqueue-speed")
    fig["spark_master"] = spark.sparkContext.master
    try:
        # JVM and Python worker warm-up, reading and writing, with two batches of full size each: the
        # JVM compiles the code that converts full batches only after it has run it for a while
        # (without this, the measured batches get faster one after the other)
        fresh(url, "SpeedWarm", 2 * k, size, "SpeedWarmOut", "error", endpoints=("SpeedWarm",))
        drain(spark, url, "SpeedWarm", 2 * k, k)
        fresh(url, "SpeedWarm", 2 * k, size, "SpeedWarmOut", "error", endpoints=("SpeedWarm",))
        queue_to_queue(spark, url, "SpeedWarm", "SpeedWarmOut", 2 * k, k)
        drop(url, "SpeedWarm", "SpeedWarmOut", endpoints=("SpeedWarm",))

        step("connector drain -> noop")
        fresh(url, "SpeedDrain", n, size, "error")
        fig["drain"] = drain(spark, url, "SpeedDrain", n, k)
        drop(url, "SpeedDrain")

        step("connector queue -> Spark -> queue")
        fresh(url, "SpeedIn", n, size, "SpeedOut", "error", endpoints=("SpeedIn",))
        fig["queue_to_queue"] = queue_to_queue(spark, url, "SpeedIn", "SpeedOut", n, k)
        drop(url, "SpeedIn", "SpeedOut", endpoints=("SpeedIn",))

        step("fixed cost per micro-batch")
        fig["fixed_cost_ms"] = fixed_cost_ms(spark, url)

        step(f"latency at {args.rate:g} msg/s for {args.seconds:g} s after {args.warmup:g} s warm-up")
        fig["latency"] = latency(spark, url, rate=args.rate, warmup=args.warmup, seconds=args.seconds,
                                 size=size, trigger=args.trigger)
        fig["latency"].update(rate=args.rate, seconds=args.seconds, trigger=args.trigger)
    finally:
        spark.stop()
    print(f"  done in {time.perf_counter() - t:.0f} s\n", flush=True, file=sys.stderr)
    return fig


def report(fig: dict[str, Any]) -> dict[str, bool]:
    """Print the table and the goals; returns the goals, met or not."""
    nsb1, nsb2, fl, dr, qq = fig["nsb_receive"], fig["nsb_receive_send_2"], fig["floor"], fig["drain"], fig["queue_to_queue"]
    lat = fig["latency"]
    print(f"| path | msg/s | ratio |\n|---|---:|---|\n"
          f"| NServiceBus receive, 1 row per transaction, 1 connection | {nsb1:,.0f} | |\n"
          f"| NServiceBus receive + send per transaction, 2 connections | {nsb2:,.0f} | |\n"
          f"| floor: DELETE ... RETURNING of {fig['per_trigger']:,} rows per transaction, fetched into Python"
          f" (binary cursor), at-least-once, no claim table | {fl:,.0f} | |\n"
          f"| connector drain -> noop sink, steady state (batch time after the first batch) and wall clock |"
          f" {dr['steady_rate']:,.0f} steady, {dr['wall_rate']:,.0f} wall |"
          f" {dr['steady_rate'] / fl:.2f}x floor (steady), {dr['wall_rate'] / fl:.2f}x floor (wall),"
          f" {dr['steady_rate'] / nsb1:.1f}x / {dr['wall_rate'] / nsb1:.1f}x NServiceBus 1-row (steady / wall) |\n"
          f"| connector queue -> Spark -> queue, exactly once, steady state and wall clock |"
          f" {qq['steady_rate']:,.0f} steady, {qq['wall_rate']:,.0f} wall |"
          f" {qq['steady_rate'] / nsb2:.1f}x (steady), {qq['wall_rate'] / nsb2:.1f}x (wall)"
          f" NServiceBus receive+send at 2 connections |\n")
    for name, r in (("drain", dr), ("queue -> queue", qq)):
        rows, ms = r["batch_rows"][2:], r["batch_ms"][2:]
        if rows:  # once a claim made ahead is in flight: the first two batches start the pipeline
            per = 50_000 / sum(rows)
            parts = {k: sum(d[k] for d in r["durations_ms"][2:]) * per for k in r["durations_ms"][0]}
            print(f"{name}, batches after the first two: {sum(rows) / (sum(ms) / 1000):,.0f} msg/s; per 50,000 messages "
                  + ", ".join(f"{k} {v:,.0f} ms" for k, v in parts.items()))
    for name, r in (("drain", dr), ("queue -> queue", qq)):
        print(f"{name}: {r['batches']} batches (rows in s): "
              + ", ".join(f"{rows:,} in {ms / 1000:.2f}" for rows, ms in zip(r["batch_rows"], r["batch_ms"], strict=True))
              + f"; wall {r['wall_s']:.1f} s from start() to the end")
    print(f"Spark master {fig['spark_master']}")
    print(f"fixed cost per micro-batch (60 batches of 10 messages of 64 B): {fig['fixed_cost_ms']:.0f} ms")
    print(f"latency INSERT -> foreachBatch on the driver at {lat['rate']:g} msg/s (trigger {lat['trigger']},"
          f" {lat['messages']} messages over {lat['seconds']:g} s, {lat['missing']} not seen):"
          f" p50 {lat['p50_s'] * 1000:.0f} ms, p90 {lat['p90_s'] * 1000:.0f} ms")
    goals = {
        f"drain steady >= {GOAL_DRAIN_FLOOR} x floor": dr["steady_rate"] >= GOAL_DRAIN_FLOOR * fl,
        f"q->q steady >= {GOAL_QQ_NSB:g} x NSB(2 conn)": qq["steady_rate"] >= GOAL_QQ_NSB * nsb2,
        f"fixed cost <= {GOAL_FIXED_MS:g} ms": fig["fixed_cost_ms"] <= GOAL_FIXED_MS,
        f"p50 <= {GOAL_P50_S:g} s": lat["p50_s"] <= GOAL_P50_S and not lat["missing"],
    }
    print("\ngoals: " + "; ".join(f"{g}: {'MET' if ok else 'NOT MET'}" for g, ok in goals.items()))
    return goals


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--rate", type=float, default=10.0, help="latency: messages a second (default 10)")
    ap.add_argument("--seconds", type=float, default=30.0, help="latency: seconds measured (default 30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="latency: seconds before measuring (default 5)")
    ap.add_argument("--trigger", default="100 milliseconds", help="latency: processingTime trigger")
    args = ap.parse_args()
    with database(args) as url:
        print(f"NServiceBus paths on {args.nsb_messages or args.messages:,} messages; random bodies\n", flush=True)
        fig = run(args, url)
        fig["database"] = "SQLQUEUE_URL" if os.environ.get("SQLQUEUE_URL") else "embedded PostgreSQL, fsync on"
        fig["goals"] = report(fig)
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
