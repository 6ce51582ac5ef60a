"""The cost of several queues in one stream: the same messages in one queue, and spread over
--queues queues read by one stream (`queue` as a list), in one run on one database.

Each run: fresh queues holding --messages messages in all (--size random bytes each,
NServiceBus-shaped headers; filled by COPY, then VACUUM ANALYZE and CHECKPOINT, as the other
scripts do); the connector drains them to a noop sink (Trigger.AvailableNow, --per-trigger
messages a batch, shared fairly among the queues). Per run: steady-state and wall-clock
messages/s, PostgreSQL CPU and WAL bytes per message (bench/phases.py's meter: the server must run
on this machine). After each run every queue and claim table must be empty, or the run is marked
CHECK FAILED and the script exits 1. The layouts run interleaved, --repeat times.

    python bench/queues.py [--messages 100000] [--queues 5] [--per-trigger 20000] [--size 1024] [--repeat 2]

With --tenants 10,100,1000 it measures instead what a stream over many queues costs (schema per
tenant, tables by NServiceBus's DDL, one stream by `queuePattern`), for each count:
- busy: --messages messages spread over the queues, drained (AvailableNow, --per-trigger a batch):
  msg/s, PostgreSQL CPU and WAL per message, statements per batch;
- idle: the same stream over the empty queues for --idle-seconds (triggers every 500 ms): per
  trigger its time (median, p90), the statements it ran and the server's CPU;
and for both the most connections the stream held (pg_stat_activity) and the threads of the
driver's source runner process. Statements are counted by pg_stat_statements, so this mode starts
its own embedded server (with the library preloaded) and ignores $SQLQUEUE_URL.

With `one` among the counts, one queue read by the `queue` option (a one-queue stream) is measured
the same way.

    python bench/queues.py --tenants one,10,100,1000 [--messages 20000] [--per-trigger 5000] [--idle-seconds 15]
                           [--claim-mode table] [--kinds]

--kinds prints, after each busy run, its statements by kind (a tenant's schema taken out of the text):
calls a queue a batch, planning and executing time; and the server's CPU by process (client
backends, autovacuum, checkpointer, the exited ones).

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import Cost, Meter, arguments, database, drain, drop, fill, reset, settle  # noqa: E402

PREFIX = "BenchQueues"


def layout(queues: int) -> list[str]:
    return [f"{PREFIX}{i}" for i in range(queues)]


def fresh(url: str, names: list[str], n: int, size: int) -> None:
    reset(url, *names, "error")
    for i, name in enumerate(names):
        fill(url, name, n // len(names) + (1 if i < n % len(names) else 0), size, random_bodies=True)
    settle(url, *names)


def left(url: str, names: list[str]) -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return sum(int(c.execute(f'SELECT (SELECT count(*) FROM "{q}") + (SELECT count(*) FROM "{q}.Claims")')
                       .fetchone()[0]) for q in names)


def run(spark: Any, url: str, meter: Meter, names: list[str], n: int, size: int, per_trigger: int) -> dict[str, Any]:
    fresh(url, names, n, size)
    cost = Cost()
    with meter.measure(cost):
        r = drain(spark, url, ", ".join(names), n, per_trigger)
        t = time.perf_counter()
        while (rest := left(url, names)) and time.perf_counter() - t < 60:
            time.sleep(0.05)
    r.update(queues=len(names), messages=n, check=rest == 0, pg_cpu_us_per_msg=cost.pg / n * 1e6,
             wal_bytes_per_msg=cost.wal / n)
    return r


def main() -> int:
    ap = arguments(__doc__)
    ap.set_defaults(messages=100_000, per_trigger=20_000)
    ap.add_argument("--queues", type=int, default=5, help="queues the messages are spread over (default 5)")
    ap.add_argument("--repeat", type=int, default=2, help="repetitions of the interleaved layouts (default 2)")
    ap.add_argument("--tenants", help="measure streams over this many tenant queues instead, e.g. 10,100,1000;"
                    " 'one': one queue read by the queue option")
    ap.add_argument("--idle-seconds", type=float, default=15.0, help="how long each idle stream is measured")
    ap.add_argument("--claim-mode", choices=["auto", "table", "prepared"], default="auto",
                    help="with --tenants: the stream's claimMode (default auto: prepared claims, which this server allows)")
    ap.add_argument("--kinds", action="store_true",
                    help="with --tenants: after each busy run, its statements by kind (pg_stat_statements, planning"
                         " tracked) and the server's CPU by process")
    args = ap.parse_args()
    if args.tenants:
        from tenants import scale

        return scale(args, args.tenants.split(","))
    n, k, size = args.messages, args.per_trigger, args.size
    layouts = {"1 queue": layout(1), f"{args.queues} queues": layout(args.queues)}
    runs = []
    with database(args) as url:
        from _spark import session

        spark = session("sqlqueue-queues")
        try:
            with contextlib.closing(Meter(url)) as meter:
                fresh(url, layouts[f"{args.queues} queues"], 2 * k, size)  # warm-up
                drain(spark, url, ", ".join(layouts[f"{args.queues} queues"]), 2 * k, k)
                for rep in range(1, args.repeat + 1):
                    for name, queues in layouts.items():
                        runs.append({"repetition": rep, "layout": name, **run(spark, url, meter, queues, n, size, k)})
                        print(f"  repetition {rep}, {name}: {runs[-1]['steady_rate']:,.0f} msg/s steady", flush=True)
                drop(url, *layout(args.queues))
        finally:
            spark.stop()
    print("\n| repetition | layout | steady msg/s | wall msg/s | batches | PostgreSQL CPU µs/msg | WAL bytes/msg | check |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in runs:
        print(f"| {r['repetition']} | {r['layout']} | {r['steady_rate']:,.0f} | {r['wall_rate']:,.0f} | {r['batches']}"
              f" | {r['pg_cpu_us_per_msg']:,.1f} | {r['wal_bytes_per_msg']:,.0f} | {'ok' if r['check'] else 'CHECK FAILED'} |")
    many = [r for r in runs if r["queues"] > 1]
    one = {r["repetition"]: r for r in runs if r["queues"] == 1}
    for key in ("steady_rate", "pg_cpu_us_per_msg", "wal_bytes_per_msg"):
        ratio = statistics.median(r[key] / one[r["repetition"]][key] for r in many)
        print(f"{args.queues} queues / 1 queue, median {key}: {ratio:.2f}x")
    return 0 if all(r["check"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
