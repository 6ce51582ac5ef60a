"""How long a stream over many existing tenant queues takes to start, without Spark and through it.

    python bench/start.py [--tenants 1000] [--claim-mode table|prepared] [--repeat 3] [--spark]

N schemas "t_NNNN" with NServiceBus's queue table "audit" each, and an "error" queue; then a stream
over them by pattern (`queuePattern "t_*"."audit"`, a `QueueSet` driven as Spark's driver drives it):
its first offset (each queue's set-up: checks, claim table, consumer lock), its first planning (what
each queue holds, the check for claims to take over, the backlog), the idle trigger after it, and the
trigger after the server ended the stream's sessions (a reconnect: every queue's set-up and consumer
lock again on the new connection). The
first stream creates the claim tables (a first start ever); the next ones find them (a restart). The
database's side as pg_stat_statements counts it: transactions and statements of the first planning.

With --spark the same stream runs through Spark (`local[2]`, conf/spark-defaults.conf, a noop sink,
Spark's default trigger) and what a user waits for is timed: from `start()` until the batch that
receives one message put in a queue before (a start: Spark's query set-up, the source's Python
process and its first offset and planning, the batch itself), with the first trigger's parts as
Spark reports them; then, with the stream idle, the server ends the stream's sessions and one more
message is put in a queue, and the time until its batch ends is a reconnect (the next trigger sets
every queue up again on new connections). The first query starts on a new checkpoint (claim tables
created); each next one restarts from that checkpoint.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

from _common import NSB_QUEUE_DDL, arguments, nsb_headers  # noqa: E402


def stream(url: str, mode: str):  # type: ignore[no-untyped-def]
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving.queueset import QueueSet

    return QueueSet(ReaderOptions.stream({"url": url, "queuePattern": '"t_*"."audit"', "errorQueue": "error",
                                          "claimMode": mode}))


def statements(url: str) -> tuple[int, int]:
    """Transactions and statements since the last reset (pg_stat_statements; not counting its own)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT coalesce(sum(calls) FILTER (WHERE query LIKE 'BEGIN%'), 0),"
                        " coalesce(sum(calls) FILTER (WHERE query NOT LIKE 'BEGIN%' AND query NOT LIKE 'COMMIT%'"
                        " AND query NOT LIKE '%pg_stat_statements%'), 0) FROM pg_stat_statements").fetchone()
        return int(row[0]), int(row[1])


def terminate(url: str) -> None:
    """End every session of the connector (they name themselves spark-qtransport)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'spark-qtransport'")


def reset_statements(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_statements_reset()")


def once(url: str, mode: str) -> dict[str, float]:
    qs = stream(url, mode)
    try:
        t0 = time.perf_counter()
        start = qs.initial_offset()
        offset = time.perf_counter() - t0
        reset_statements(url)
        t1 = time.perf_counter()
        end = qs.latest(start, 1000)
        planning = time.perf_counter() - t1
        transactions, stmts = statements(url)
        qs.committed(end)
        t2 = time.perf_counter()
        end = qs.latest(end, 1000)
        idle = time.perf_counter() - t2
        qs.committed(end)
        qs.sessions.background.drain()
        terminate(url)  # the server ends the stream's sessions (a failover, a restart): the next trigger reconnects
        t3 = time.perf_counter()
        qs.latest(end, 1000)
        reconnect = time.perf_counter() - t3
        return {"first offset s": offset, "first planning s": planning, "start s": offset + planning,
                "idle trigger ms": idle * 1000, "reconnect s": reconnect, "planning transactions": transactions,
                "planning statements": stmts}
    finally:
        qs.close()


def put(url: str, queue: str) -> None:
    """One message with NServiceBus's headers in `queue` (a schema-qualified name, quoted)."""
    import uuid

    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        message_id = str(uuid.uuid4())
        c.execute(f"INSERT INTO {queue} (id, headers, body) VALUES (%s, %s, %s)",
                  (message_id, nsb_headers(message_id), b"{}"))


def received(query, rows: int, timeout: float = 120.0) -> dict:  # type: ignore[no-untyped-def]
    """Wait until `query` has received `rows` rows in all; the progress of the batch that got there."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        got = 0
        for progress in query.recentProgress:
            got += progress["numInputRows"]
            if got >= rows:
                return progress
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        time.sleep(0.005)
    raise TimeoutError(f"{rows} row(s) not received in {timeout:.0f} s")


def through_spark(url: str, mode: str, tenants: int, repeat: int) -> list[dict[str, float]]:
    import shutil
    import tempfile

    from _spark import session

    spark = session("sqlqueue-start")
    ckpt = tempfile.mkdtemp(prefix="bench-start-")
    runs = []
    try:
        for i in range(1 + repeat):
            df = (spark.readStream.format("sqlqueue").option("url", url).option("queuePattern", '"t_*"."audit"')
                  .option("errorQueue", "error").option("claimMode", mode).load())
            put(url, f'"t_{(2 * i) % tenants:04d}"."audit"')
            t0 = time.perf_counter()
            query = df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
            try:
                first = received(query, 1)
                start = time.perf_counter() - t0
                parts = first["durationMs"]
                time.sleep(1.0)  # idle triggers
                terminate(url)
                put(url, f'"t_{(2 * i + 1) % tenants:04d}"."audit"')
                t1 = time.perf_counter()
                received(query, 2)
                reconnect = time.perf_counter() - t1
            finally:
                query.stop()
            runs.append({"start s": start, "its latestOffset s": parts.get("latestOffset", 0) / 1000,
                         "its queryPlanning s": parts.get("queryPlanning", 0) / 1000,
                         "its trigger s": parts.get("triggerExecution", 0) / 1000, "reconnect s": reconnect})
            print(f"  {'first start' if i == 0 else f'restart {i}'}: start {start:.2f} s, reconnect {reconnect:.2f} s",
                  flush=True)
    finally:
        spark.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    return runs


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--claim-mode", choices=["table", "prepared"], default="table")
    ap.add_argument("--repeat", type=int, default=3, help="restarts measured after the first start (default 3)")
    ap.add_argument("--spark", action="store_true", help="through Spark: a query's start and a reconnect")
    args = ap.parse_args()
    import psycopg

    from spark_qtransport.cli.embedded import EmbeddedPostgres

    with EmbeddedPostgres(fsync=True, settings={"shared_preload_libraries": "pg_stat_statements"}) as pg:
        with psycopg.connect(pg.url, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_stat_statements")
            with c.transaction():
                for i in range(args.tenants):
                    c.execute(f'CREATE SCHEMA "t_{i:04d}"')
                    c.execute(NSB_QUEUE_DDL.format(f't_{i:04d}"."audit'))
                c.execute(NSB_QUEUE_DDL.format("error"))
        print(f"PostgreSQL: embedded, fsync on; {args.tenants:,} tenant queues (NServiceBus's DDL), "
              f"claimMode {args.claim_mode}; " + ("through Spark" if args.spark else "no Spark") + "\n", flush=True)
        if args.spark:
            runs = through_spark(pg.url, args.claim_mode, args.tenants, args.repeat)
        else:
            runs = [once(pg.url, args.claim_mode) for _ in range(1 + args.repeat)]
    keys = list(runs[0])
    print("| | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    print("| first start (claim tables created) | " + " | ".join(f"{runs[0][k]:,.2f}" for k in keys) + " |")
    print(f"| restart, median of {args.repeat} | "
          + " | ".join(f"{statistics.median(r[k] for r in runs[1:]):,.2f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
