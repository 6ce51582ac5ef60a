"""The speed table: the connector against the NServiceBus way and against the floor, in one run on one database,
with what each path costs the database.

Every path gets fresh queues made by NServiceBus's own PostgreSQL DDL (`_common.nsb_queue`: id uuid
primary key, expires, headers text, body bytea, seq serial, int4); the connector creates its own
tables (claims, staging, outbox, delayed). The source queue holds --messages messages, each with the
headers an NServiceBus endpoint writes (`_common.nsb_headers`: 13 headers, about 800 bytes, its own
ids) and --size random bytes (incompressible), filled by COPY, then VACUUM ANALYZE and CHECKPOINT
before the path starts (as bench/phases.py does), so every path starts equal. The paths, in order:

  1. NServiceBus receive + send per transaction (SendsAtomicWithReceive), 2 connections;
  2. NServiceBus receive: one row per transaction (its receive SQL), 1 connection;
  3. the floor: bench/phases.py's DELETE ... RETURNING of --per-trigger rows per transaction,
     fetched into Python (binary cursor), committed, until empty: at-least-once, no claim table;
  4. the floor of queue -> queue, new messages: the same DELETE, each row's body sent as a new
     message (headers built in Python, about what the connector's sink writes), binary COPY into
     the destination queue, delete and copy in one transaction per --per-trigger rows;
  5. the floor of queue -> queue, forwarded: the same, the source row's headers passed through;
  6. the connector draining the queue: queue -> Spark -> noop sink, Trigger.AvailableNow;
  7. the connector queue -> Spark -> queue, new messages, exactly once through the outbox: the
     stream selects body and a literal message_type, the destination is the sink's option, so
     the sink builds every header; the destination is checked for --messages distinct MessageIds;
  8. the same, forwarded: body, message_id, message_type and headers passed through.

Each path is metered as a whole (`_common.Meter`): PostgreSQL CPU (its processes, from /proc: the
server must run on this machine) and WAL bytes (pg_current_wal_lsn), per message; the connector's
from before its query starts until its claim table is empty after it ended (the last
acknowledgement). For 6-8: steady state (the batches after the first: rows / their triggerExecution)
and wall clock (messages / start() to end); before them the session is warmed up with two full
batches of each. Then the fixed cost of a micro-batch (60 batches of 10 64-byte messages: batch
time / 60, as receive_bench.py measures it), and the latency from INSERT to output at --rate msg/s
(a producer thread inserts and commits one message at a time; a foreachBatch on the driver notes
when it sees each; latency = seen - commit returned, over --seconds after --warmup). Last, the
ratios and the goals of the speed work, each MET or NOT MET.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    NSB_SEND,
    Cost,
    Meter,
    arguments,
    counted,
    database,
    drain,
    drop,
    fill,
    floor,
    floor_to_queue,
    nsb_headers,
    nsb_receive,
    nsb_receive_send,
    queue_to_queue,
    reset,
    settle,
)

#: the goals of the speed work: the database's CPU and WAL per message of the drain at most 2x the
#: floor's, of queue -> queue new messages at most 1.5x its floor's; drain steady >= 0.6x the floor's
#: msg/s; queue -> queue new messages steady >= 10x NServiceBus receive + send at 2 connections;
#: fixed cost per micro-batch <= 300 ms; p50 latency <= 0.3 s at 10 msg/s
GOAL_DRAIN_COST, GOAL_QQ_COST, GOAL_DRAIN_FLOOR, GOAL_QQ_NSB, GOAL_FIXED_MS, GOAL_P50_S = 2.0, 1.5, 0.6, 10.0, 300.0, 0.3


def fresh(url: str, queue: str, n: int, size: int, *also: str, endpoints: tuple[str, ...] = ()) -> None:
    """A new queue of n messages (NServiceBus's headers, random bodies) plus empty queues `also`, all by
    NServiceBus's DDL; VACUUM ANALYZE, CHECKPOINT."""
    reset(url, queue, *also, endpoints=endpoints, nsb=True)
    if n:
        fill(url, queue, n, size, random_bodies=True, nsb=True)
    settle(url, queue)


def measured(meter: Meter, n: int, path: Callable[[], float]) -> dict[str, Any]:
    """A path outside Spark, metered as a whole: its msg/s, wall, PostgreSQL CPU and WAL (per message)."""
    cost = Cost()
    with meter.measure(cost):
        rate = path()
    return per_message({"rate": rate, "wall_s": cost.wall, "pg_cpu_s": cost.pg, "wal_bytes": cost.wal}, n)


def per_message(r: dict[str, Any], n: int) -> dict[str, Any]:
    r.update(messages=n, pg_cpu_us_per_msg=r["pg_cpu_s"] / n * 1e6, wal_bytes_per_msg=r["wal_bytes"] / n)
    return r


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

    def produce() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            tick = time.perf_counter()
            while not stop.is_set():
                mid = str(uuid.uuid4())
                conn.execute(NSB_SEND.format(queue), (mid, nsb_headers(mid), os.urandom(size)))  # autocommit: committed
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
    fig: dict[str, Any] = {"messages": n, "size": size, "per_trigger": k, "nsb_messages": nsb_n,
                           "ddl": "NServiceBus's PostgreSQL queue DDL (seq serial, int4)",
                           "header_bytes": len(nsb_headers())}
    meter = Meter(url)

    def step(what: str) -> float:
        print(f"  {what} ...", flush=True, file=sys.stderr)
        return time.perf_counter()

    def checked(queue: str, want: int) -> None:
        got = counted(url, queue)
        assert got == (want, want), f"{queue} holds {got[0]:,} rows, {got[1]:,} distinct message ids; expected {want:,}"

    t = step("NServiceBus receive + send, 2 connections")
    fresh(url, "SpeedNsbIn", nsb_n, size, "SpeedNsbOut")
    fig["nsb_receive_send_2"] = measured(meter, nsb_n, lambda: nsb_receive_send(url, "SpeedNsbIn", "SpeedNsbOut", nsb_n, 2))
    checked("SpeedNsbOut", nsb_n)
    drop(url, "SpeedNsbIn", "SpeedNsbOut")

    step("NServiceBus receive, 1 connection")
    fresh(url, "SpeedNsb", nsb_n, size)
    fig["nsb_receive"] = measured(meter, nsb_n, lambda: nsb_receive(url, "SpeedNsb", nsb_n))
    drop(url, "SpeedNsb")

    step("floor")
    fresh(url, "SpeedFloor", n, size)
    fig["floor"] = measured(meter, n, lambda: floor(url, "SpeedFloor", n, k))
    drop(url, "SpeedFloor")

    for key, new in (("floor_qq_new", True), ("floor_qq_forward", False)):
        step(f"floor, queue -> queue, {'new messages' if new else 'forwarded'}")
        fresh(url, "SpeedFloorIn", n, size, "SpeedFloorOut")
        fig[key] = measured(meter, n, lambda new=new: floor_to_queue(url, "SpeedFloorIn", "SpeedFloorOut", n, k,
                                                                     new_messages=new))
        checked("SpeedFloorOut", n)
        drop(url, "SpeedFloorIn", "SpeedFloorOut")

    step("Spark session and warm-up")
    from _spark import session

    spark = session("sqlqueue-speed")
    fig["spark_master"] = spark.sparkContext.master
    try:
        # JVM and Python worker warm-up, reading and writing (new and forwarded messages), with two
        # batches of full size each: the JVM compiles the code that converts full batches only after
        # it has run it for a while (without this, the measured batches get faster one after the other)
        # (each sending path its own endpoint: the connector's processes keep knowing the tables they
        # made, so a name's tables are not dropped and made again while the session lives)
        fresh(url, "SpeedWarm", 2 * k, size, "error")
        drain(spark, url, "SpeedWarm", 2 * k, k)
        drop(url, "SpeedWarm")
        for src, new in (("SpeedWarmNew", True), ("SpeedWarm", False)):
            fresh(url, src, 2 * k, size, "SpeedWarmOut", "error", endpoints=(src,))
            queue_to_queue(spark, url, src, "SpeedWarmOut", 2 * k, k, new_messages=new)
            drop(url, src, "SpeedWarmOut", endpoints=(src,))

        step("connector drain -> noop")
        fresh(url, "SpeedDrain", n, size, "error")
        fig["drain"] = per_message(drain(spark, url, "SpeedDrain", n, k, meter=meter), n)
        drop(url, "SpeedDrain")

        for key, src, new in (("queue_to_queue_new", "SpeedInNew", True), ("queue_to_queue", "SpeedIn", False)):
            step(f"connector queue -> Spark -> queue, {'new messages' if new else 'forwarded'}")
            fresh(url, src, n, size, "SpeedOut", "error", endpoints=(src,))
            fig[key] = per_message(queue_to_queue(spark, url, src, "SpeedOut", n, k, new_messages=new, meter=meter), n)
            drop(url, src, "SpeedOut", endpoints=(src,))

        step("fixed cost per micro-batch")
        fig["fixed_cost_ms"] = fixed_cost_ms(spark, url)

        step(f"latency at {args.rate:g} msg/s for {args.seconds:g} s after {args.warmup:g} s warm-up")
        fig["latency"] = latency(spark, url, rate=args.rate, warmup=args.warmup, seconds=args.seconds,
                                 size=size, trigger=args.trigger)
        fig["latency"].update(rate=args.rate, seconds=args.seconds, trigger=args.trigger)
    finally:
        spark.stop()
        meter.close()
    print(f"  done in {time.perf_counter() - t:.0f} s\n", flush=True, file=sys.stderr)
    return fig


def ratios(fig: dict[str, Any]) -> dict[str, float]:
    """The ratios the goals and the table use: msg/s (the connector's steady state), PostgreSQL CPU
    and WAL per message, each against its reference."""
    fl, fn, ff, nsb2 = fig["floor"], fig["floor_qq_new"], fig["floor_qq_forward"], fig["nsb_receive_send_2"]
    out = {}
    for name, r, ref in (("drain/floor", fig["drain"], fl), ("qq_new/floor_qq_new", fig["queue_to_queue_new"], fn),
                         ("qq_forward/floor_qq_forward", fig["queue_to_queue"], ff)):
        out[f"{name} steady"] = r["steady_rate"] / ref["rate"]
        out[f"{name} wall"] = r["wall_rate"] / ref["rate"]
        out[f"{name} cpu"] = r["pg_cpu_us_per_msg"] / ref["pg_cpu_us_per_msg"]
        out[f"{name} wal"] = r["wal_bytes_per_msg"] / ref["wal_bytes_per_msg"]
    for name, key in (("qq_new", "queue_to_queue_new"), ("qq_forward", "queue_to_queue")):
        out[f"{name}/nsb2 steady"] = fig[key]["steady_rate"] / nsb2["rate"]
        out[f"{name}/nsb2 wall"] = fig[key]["wall_rate"] / nsb2["rate"]
    out["floor_qq_new/nsb2"] = fn["rate"] / nsb2["rate"]
    return out


def report(fig: dict[str, Any]) -> dict[str, bool]:
    """Print the table, the ratios and the goals; returns the goals, met or not."""
    k = fig["per_trigger"]
    x = fig["ratios"] = ratios(fig)
    lat = fig["latency"]

    def cost(r: dict[str, Any]) -> str:
        return f"{r['pg_cpu_us_per_msg']:,.1f} | {r['wal_bytes_per_msg']:,.0f}"

    def plain(label: str, r: dict[str, Any], note: str = "") -> str:
        return f"| {label} | {r['rate']:,.0f} | {cost(r)} | {note} |"

    def spark_row(label: str, r: dict[str, Any], note: str) -> str:
        return (f"| {label} | {r['steady_rate']:,.0f} steady, {r['wall_rate']:,.0f} wall ({r['wall_s']:.1f} s) |"
                f" {cost(r)} | {note} |")

    def against(name: str, ref: str) -> str:
        return (f"{x[name + ' steady']:.2f}x {ref} msg/s ({x[name + ' wall']:.2f}x wall), PG CPU/msg {x[name + ' cpu']:.2f}x,"
                f" WAL/msg {x[name + ' wal']:.2f}x")

    rows = [
        "| path | msg/s | PG CPU µs/msg | WAL bytes/msg | ratios |",
        "|---|---:|---:|---:|---|",
        plain("NServiceBus receive + send, 1 row per transaction, 2 connections", fig["nsb_receive_send_2"]),
        plain("NServiceBus receive, 1 row per transaction, 1 connection", fig["nsb_receive"]),
        plain(f"floor: `DELETE ... RETURNING` {k:,} per transaction, binary fetch into Python, at-least-once",
              fig["floor"]),
        plain(f"floor, queue -> queue, new messages: the DELETE, headers built in Python, binary COPY, {k:,} per"
              " transaction, at-least-once", fig["floor_qq_new"],
              f"{x['floor_qq_new/nsb2']:.1f}x NServiceBus receive + send at 2 connections"),
        plain("floor, queue -> queue, forwarded headers: the same, headers passed through", fig["floor_qq_forward"]),
        spark_row("connector drain -> noop", fig["drain"], against("drain/floor", "floor")),
        spark_row("**connector queue -> Spark -> queue, new messages** (exactly once)", fig["queue_to_queue_new"],
                  f"**{x['qq_new/nsb2 steady']:.1f}x NServiceBus receive + send at 2 connections**"
                  f" ({x['qq_new/nsb2 wall']:.1f}x wall); against its floor: " + against("qq_new/floor_qq_new", "floor")),
        spark_row("connector queue -> Spark -> queue, forwarded headers (exactly once)", fig["queue_to_queue"],
                  f"{x['qq_forward/nsb2 steady']:.1f}x NServiceBus at 2 connections; against its floor: "
                  + against("qq_forward/floor_qq_forward", "floor")),
    ]
    print("\n".join(rows) + "\n")
    connector = (("drain", fig["drain"]), ("queue -> queue, new messages", fig["queue_to_queue_new"]),
                 ("queue -> queue, forwarded", fig["queue_to_queue"]))
    for name, r in connector:
        rows_, ms = r["batch_rows"][2:], r["batch_ms"][2:]
        if rows_:  # once a claim made ahead is in flight: the first two batches start the pipeline
            per = 50_000 / sum(rows_)
            parts = {key: sum(d[key] for d in r["durations_ms"][2:]) * per for key in r["durations_ms"][0]}
            print(f"{name}, batches after the first two: {sum(rows_) / (sum(ms) / 1000):,.0f} msg/s; per 50,000 messages "
                  + ", ".join(f"{key} {v:,.0f} ms" for key, v in parts.items()))
    for name, r in connector:
        print(f"{name}: {r['batches']} batches (rows in s): "
              + ", ".join(f"{rows_:,} in {ms / 1000:.2f}" for rows_, ms in zip(r["batch_rows"], r["batch_ms"], strict=True))
              + f"; wall {r['wall_s']:.1f} s from start() to the end; metered {r['metered_s']:.1f} s"
              f" (last claim acknowledged {r['ack_wait_s']:.2f} s after the end)")
    print(f"Spark master {fig['spark_master']}; queues by {fig['ddl']}; NServiceBus headers {fig['header_bytes']} bytes")
    print(f"fixed cost per micro-batch (60 batches of 10 messages of 64 B): {fig['fixed_cost_ms']:.0f} ms")
    print(f"latency INSERT -> foreachBatch on the driver at {lat['rate']:g} msg/s (trigger {lat['trigger']},"
          f" {lat['messages']} messages over {lat['seconds']:g} s, {lat['missing']} not seen):"
          f" p50 {lat['p50_s'] * 1000:.0f} ms, p90 {lat['p90_s'] * 1000:.0f} ms")
    checks = [  # (goal, the figure, met)
        (f"drain PG CPU/msg <= {GOAL_DRAIN_COST:g}x floor", f"{x['drain/floor cpu']:.2f}x",
         x["drain/floor cpu"] <= GOAL_DRAIN_COST),
        (f"drain WAL/msg <= {GOAL_DRAIN_COST:g}x floor", f"{x['drain/floor wal']:.2f}x",
         x["drain/floor wal"] <= GOAL_DRAIN_COST),
        (f"q->q new messages PG CPU/msg <= {GOAL_QQ_COST:g}x its floor", f"{x['qq_new/floor_qq_new cpu']:.2f}x",
         x["qq_new/floor_qq_new cpu"] <= GOAL_QQ_COST),
        (f"q->q new messages WAL/msg <= {GOAL_QQ_COST:g}x its floor", f"{x['qq_new/floor_qq_new wal']:.2f}x",
         x["qq_new/floor_qq_new wal"] <= GOAL_QQ_COST),
        (f"drain steady >= {GOAL_DRAIN_FLOOR:g}x floor msg/s", f"{x['drain/floor steady']:.2f}x",
         x["drain/floor steady"] >= GOAL_DRAIN_FLOOR),
        (f"q->q new messages steady >= {GOAL_QQ_NSB:g}x NServiceBus receive + send at 2 connections",
         f"{x['qq_new/nsb2 steady']:.1f}x", x["qq_new/nsb2 steady"] >= GOAL_QQ_NSB),
        (f"fixed cost per micro-batch <= {GOAL_FIXED_MS:g} ms", f"{fig['fixed_cost_ms']:.0f} ms",
         fig["fixed_cost_ms"] <= GOAL_FIXED_MS),
        (f"p50 latency at {lat['rate']:g} msg/s <= {GOAL_P50_S:g} s", f"{lat['p50_s'] * 1000:.0f} ms",
         lat["p50_s"] <= GOAL_P50_S and not lat["missing"]),
    ]
    print("\ngoals:\n" + "\n".join(f"- {g}: {'MET' if ok else 'NOT MET'} ({v})" for g, v, ok in checks))
    return {g: ok for g, _, ok in checks}


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--rate", type=float, default=10.0, help="latency: messages a second (default 10)")
    ap.add_argument("--seconds", type=float, default=30.0, help="latency: seconds measured (default 30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="latency: seconds before measuring (default 5)")
    ap.add_argument("--trigger", default="100 milliseconds", help="latency: processingTime trigger")
    args = ap.parse_args()
    with database(args) as url:
        print(f"NServiceBus paths on {args.nsb_messages or args.messages:,} messages; random bodies;"
              " queues by NServiceBus's DDL\n", flush=True)
        fig = run(args, url)
        fig["database"] = "SQLQUEUE_URL" if os.environ.get("SQLQUEUE_URL") else "embedded PostgreSQL, fsync on"
        fig["goals"] = report(fig)
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
