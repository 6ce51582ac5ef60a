"""How long a stream over many existing tenant queues takes to start, without Spark.

    python bench/start.py [--tenants 1000] [--claim-mode table|prepared] [--repeat 3]

N schemas "t_NNNN" with NServiceBus's queue table "audit" each, and an "error" queue; then a stream
over them by pattern (`queuePattern "t_*"."audit"`, a `QueueSet` driven as Spark's driver drives it):
its first offset (each queue's set-up: checks, claim table, consumer lock), its first planning (what
each queue holds, the check for claims to take over, the backlog), the idle trigger after it, and the
trigger after the server ended the stream's sessions (a reconnect: every queue's set-up and consumer
lock again on the new connection). The
first stream creates the claim tables (a first start ever); the next ones find them (a restart). The
database's side as pg_stat_statements counts it: transactions and statements of the first planning.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import NSB_QUEUE_DDL, arguments  # noqa: E402


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


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--claim-mode", choices=["table", "prepared"], default="table")
    ap.add_argument("--repeat", type=int, default=3, help="restarts measured after the first start (default 3)")
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
              f"claimMode {args.claim_mode}; no Spark\n")
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
