"""The cost of auditing: the connector draining a queue without auditQueue, with it, and with forwardTo, in one run on one database.

Each run: a fresh queue of --messages messages (--size random bytes each, NServiceBus-shaped
headers; filled by COPY, then VACUUM ANALYZE and CHECKPOINT, as the other scripts do) and fresh,
empty audit and forward queues; the connector drains it to a noop sink (Trigger.AvailableNow,
--per-trigger messages a batch):

  off         no platform option: each acknowledgement deletes its claims;
  auditQueue  every acknowledged message copied into the audit queue with NServiceBus's audit
              headers, in the acknowledgement's transaction (headers read by the driver, bodies
              copied server-side from the claim table);
  forwardTo   the same path, an unchanged copy into the forward queue (--skip-forward leaves it out).

Per run: steady-state and wall-clock messages/s (as _common.stream_rates gives them), PostgreSQL CPU
(utime + stime of the postmaster and its children, as bench/phases.py measures it: the server must
run on this machine), Spark's CPU (this process and its descendants: the JVM and its Python workers,
where the driver reads the headers it audits) and WAL bytes, from start() until every claim is
acknowledged; per message. After each run the audit and forward queues are counted: each must hold
exactly --messages rows with as many distinct message ids (or none, when its option is off); a run
that does not is marked CHECK FAILED (its copies and distinct ids are in the table) and the script
exits with status 1 after printing every figure.

The paths run interleaved, --repeat times (off, auditQueue, forwardTo, off, ...): the machine's
load moves between runs, so compare the ratios of each repetition, on against off.

    python bench/audit.py [--messages 100000] [--per-trigger 20000] [--size 1024] [--repeat 2] [--json audit.json]

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import Cost, Meter, arguments, database, drain, drop, fill, reset, settle  # noqa: E402

SOURCE, AUDIT, FORWARD, ERROR = "BenchAuditIn", "BenchAudit", "BenchForward", "error"
#: path -> the reader options it adds
PATHS: dict[str, dict[str, str]] = {"off": {}, "auditQueue": {"auditQueue": AUDIT}, "forwardTo": {"forwardTo": FORWARD}}


def fresh(url: str, n: int, size: int) -> None:
    """A new source queue of n messages (random bodies), new empty audit, forward and error queues."""
    reset(url, SOURCE, AUDIT, FORWARD, ERROR)
    fill(url, SOURCE, n, size, random_bodies=True)
    settle(url, SOURCE)


def count(url: str, queue: str) -> tuple[int, int]:
    """Rows of a queue, and its distinct NServiceBus message ids."""
    import psycopg

    with psycopg.connect(url) as c:
        got = c.execute(f'SELECT count(*), count(DISTINCT headers::json->>\'NServiceBus.MessageId\') FROM "{queue}"').fetchone()
    return got  # type: ignore[return-value]


def unacknowledged(url: str) -> int:
    """Messages still in the source queue or its claim table."""
    import psycopg

    with psycopg.connect(url) as c:
        got = c.execute(f'SELECT (SELECT count(*) FROM "{SOURCE}") + (SELECT count(*) FROM "{SOURCE}.Claims")').fetchone()
    return int(got[0])  # type: ignore[index]


def spark_cpu(postmaster: int | None) -> float:
    """CPU seconds of this process and its descendants (the JVM, its Python workers; the ended ones
    through their parents' cutime + cstime), leaving out a local PostgreSQL's processes."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(pid)] = int(s[1])
        ticks[int(pid)] = sum(int(v) for v in s[11:15])
    ours, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        if p in ours or p == postmaster:
            continue
        ours.add(p)
        todo.extend(c for c, pp in parents.items() if pp == p)
    return sum(ticks.get(p, 0) for p in ours) / os.sysconf("SC_CLK_TCK")


def run(spark: Any, url: str, meter: Meter, path: str, n: int, size: int, per_trigger: int) -> dict[str, Any]:
    """One drain of n fresh messages on `path`, measured until every claim is acknowledged; checked."""
    fresh(url, n, size)
    cost = Cost()
    spark0 = spark_cpu(meter.postmaster)
    with meter.measure(cost):
        r = drain(spark, url, SOURCE, n, per_trigger, PATHS[path])
        # the query's stop() waits for the acknowledgements in flight; this only makes sure
        t = time.perf_counter()
        while (left := unacknowledged(url)) and time.perf_counter() - t < 60:
            time.sleep(0.05)
        r["ack_wait_s"] = time.perf_counter() - t
    r["spark_cpu_s"] = spark_cpu(meter.postmaster) - spark0
    assert not left, f"{left} messages not acknowledged 60 s after the query ended"
    r["audit_rows"], r["audit_ids"] = count(url, AUDIT)
    r["forward_rows"], r["forward_ids"] = count(url, FORWARD)
    want_audit, want_forward = (n if path == "auditQueue" else 0), (n if path == "forwardTo" else 0)
    r["check"] = ((r["audit_rows"], r["audit_ids"], r["forward_rows"], r["forward_ids"])
                  == (want_audit, want_audit, want_forward, want_forward))
    print(f"  {path}: audit queue holds {r['audit_rows']:,} rows ({r['audit_ids']:,} distinct message ids),"
          f" forward queue {r['forward_rows']:,} ({r['forward_ids']:,}); expected {want_audit:,} and {want_forward:,}:"
          f" {'ok' if r['check'] else 'CHECK FAILED'}", flush=True)
    r.update(path=path, messages=n, pg_cpu_s=cost.pg, wal_bytes=cost.wal, pg_cpu_us_per_msg=cost.pg / n * 1e6,
             spark_cpu_us_per_msg=r["spark_cpu_s"] / n * 1e6, wal_bytes_per_msg=cost.wal / n)
    return r


def ratios(runs: list[dict[str, Any]], paths: list[str]) -> list[dict[str, Any]]:
    """Each repetition's on / off ratios, per path with an option."""
    out = []
    for rep in sorted({r["repetition"] for r in runs}):
        by = {r["path"]: r for r in runs if r["repetition"] == rep}
        off = by["off"]
        for path in paths[1:]:
            on = by[path]
            out.append({"repetition": rep, "path": path,
                        **{k: on[k] / off[k] for k in ("steady_rate", "wall_rate", "pg_cpu_us_per_msg",
                                                       "spark_cpu_us_per_msg", "wal_bytes_per_msg")}})
    return out


def tables(runs: list[dict[str, Any]], rat: list[dict[str, Any]]) -> None:
    print("\n| repetition | path | steady msg/s | wall msg/s | PostgreSQL CPU s | PostgreSQL CPU µs/msg"
          " | Spark CPU µs/msg | WAL bytes/msg | audit rows (distinct) | forward rows (distinct) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r['repetition']} | {r['path']} | {r['steady_rate']:,.0f} | {r['wall_rate']:,.0f} | {r['pg_cpu_s']:.2f}"
              f" | {r['pg_cpu_us_per_msg']:,.1f} | {r['spark_cpu_us_per_msg']:,.1f} | {r['wal_bytes_per_msg']:,.0f}"
              f" | {r['audit_rows']:,} ({r['audit_ids']:,}) | {r['forward_rows']:,} ({r['forward_ids']:,})"
              f"{'' if r['check'] else ' CHECK FAILED'} |")
    print("\nOn / off, each repetition against its own off run:\n")
    print("| repetition | path | steady msg/s | wall msg/s | PostgreSQL CPU/msg | Spark CPU/msg | WAL/msg |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for x in rat:
        print(f"| {x['repetition']} | {x['path']} / off | {x['steady_rate']:.2f}x | {x['wall_rate']:.2f}x"
              f" | {x['pg_cpu_us_per_msg']:.2f}x | {x['spark_cpu_us_per_msg']:.2f}x | {x['wal_bytes_per_msg']:.2f}x |")
    for path in sorted({x["path"] for x in rat}):
        mine = [x for x in rat if x["path"] == path]
        print(f"{path} / off, median of {len(mine)}: steady {statistics.median(x['steady_rate'] for x in mine):.2f}x,"
              f" PostgreSQL CPU/msg {statistics.median(x['pg_cpu_us_per_msg'] for x in mine):.2f}x,"
              f" WAL/msg {statistics.median(x['wal_bytes_per_msg'] for x in mine):.2f}x")


def main() -> int:
    ap = arguments(__doc__)
    ap.set_defaults(messages=100_000, per_trigger=20_000)
    ap.add_argument("--repeat", type=int, default=2, help="repetitions of the interleaved paths (default 2)")
    ap.add_argument("--skip-forward", action="store_true", help="leave out the forwardTo path")
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = ap.parse_args()
    n, k, size = args.messages, args.per_trigger, args.size
    paths = [p for p in PATHS if not (args.skip_forward and p == "forwardTo")]
    with database(args) as url:
        from _spark import session

        spark = session("sqlqueue-audit")
        try:
            with contextlib.closing(Meter(url)) as meter:
                # JVM and Python worker warm-up, two full batches with auditing (as speed.py warms up)
                t = time.perf_counter()
                fresh(url, 2 * k, size)
                drain(spark, url, SOURCE, 2 * k, k, PATHS["auditQueue"])
                print(f"warm-up: {time.perf_counter() - t:.0f} s", flush=True)
                runs = []
                for rep in range(1, args.repeat + 1):
                    for path in paths:
                        t = time.perf_counter()
                        runs.append({"repetition": rep, **run(spark, url, meter, path, n, size, k)})
                        print(f"  repetition {rep}, {path}: {time.perf_counter() - t:.0f} s with its fill", flush=True)
                drop(url, SOURCE, AUDIT, FORWARD)
        finally:
            spark.stop()
    rat = ratios(runs, paths)
    tables(runs, rat)
    if args.json:
        fig = {"messages": n, "size": size, "per_trigger": k, "repeat": args.repeat, "cores": os.cpu_count(),
               "database": "SQLQUEUE_URL" if os.environ.get("SQLQUEUE_URL") else "embedded, fsync on",
               "runs": [{key: v for key, v in r.items() if key != "durations_ms"} for r in runs], "ratios": rat}
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    failed = [f"repetition {r['repetition']} {r['path']}" for r in runs if not r["check"]]
    if failed:
        print(f"\nCHECK FAILED (the audit or forward queue does not hold exactly {n:,} distinct messages): {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
