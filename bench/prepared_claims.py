"""A design step measured, not built: claims held by prepared transactions instead of a claim table.

Today's claim moves every message into the claim table (a second durable write of each body) and
the acknowledgement deletes it from there (a read of its headers, a delete, a vacuum). A claim could
instead DELETE the queue rows and PREPARE TRANSACTION: the rows stay readable by plain SELECTs (the
executors' reads) while other consumers' FOR UPDATE SKIP LOCKED skip them, a prepared transaction
outlives the session and a server crash (so a batch can be replayed), and the acknowledgement is
COMMIT PREPARED; a consumer that dies leaves the transaction for the next run to find in
pg_prepared_xacts. This script measures what that costs the server against the floor, on
NServiceBus's tables and headers: per message, PostgreSQL CPU and WAL of the claim (DELETE ...
RETURNING seq, PREPARE), the read (the claimed range, binary, from another session) and the
acknowledgement (COMMIT PREPARED), and of the floor (DELETE ... RETURNING the rows).

    python bench/prepared_claims.py [--messages 200000] [--per-trigger 50000] [--size 1024] [--repeat 2]

Needs max_prepared_transactions > 0 (a server restart): it starts its own embedded PostgreSQL
with fsync on and max_prepared_transactions 10. What the design would still need is in
bench/README.md (the speed section of 2026-11-24).
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Cost, Meter, arguments, fill, floor_sql, reset, settle  # noqa: E402

QUEUE = "BenchPrepared"


def fresh(url: str, n: int, size: int) -> None:
    reset(url, QUEUE, nsb=True)
    fill(url, QUEUE, n, size, random_bodies=True, nsb=True)
    settle(url, QUEUE)


def run_floor(url: str, meter: Meter, per_trigger: int, cost: Cost) -> None:
    with meter.measure(cost), psycopg.connect(url) as conn:
        while True:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(floor_sql(QUEUE, per_trigger)).fetchall()
            conn.commit()
            cost.rows += len(rows)
            if not rows:
                return


def run_prepared(url: str, meter: Meter, per_trigger: int, costs: dict[str, Cost]) -> None:
    claim = (f'DELETE FROM "{QUEUE}" WHERE seq IN (SELECT seq FROM "{QUEUE}" ORDER BY seq LIMIT {per_trigger} '
             "FOR UPDATE SKIP LOCKED) RETURNING seq")
    read = f'SELECT seq, id, headers, body FROM "{QUEUE}" WHERE seq >= %s AND seq <= %s ORDER BY seq'
    with psycopg.connect(url, autocommit=True) as acker, psycopg.connect(url) as reader:
        batch = 0
        while True:
            with meter.measure(costs["claim"]), psycopg.connect(url) as conn:
                seqs = [s for (s,) in conn.execute(claim).fetchall()]
                if not seqs:
                    conn.rollback()
                    return
                conn.execute(f"PREPARE TRANSACTION 'bench-claim-{batch}'")
            with meter.measure(costs["read"]):
                with reader.cursor(binary=True) as cur:
                    rows = cur.execute(read, (min(seqs), max(seqs))).fetchall()
                reader.commit()
            assert len(rows) == len(seqs), (len(rows), len(seqs))  # nobody else consumes here
            with meter.measure(costs["acknowledge"]):
                acker.execute(f"COMMIT PREPARED 'bench-claim-{batch}'")
            for c in costs.values():
                c.rows += len(seqs)
            batch += 1


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(fsync=True, settings={"max_prepared_transactions": "10"}).start()
    try:
        print(f"embedded PostgreSQL, fsync on, max_prepared_transactions 10; {args.messages:,} messages of "
              f"{args.size} B (random) with NServiceBus's headers, on its DDL; {args.per_trigger:,} per transaction\n")
        print("| run | path | PG CPU us/msg | WAL B/msg | ratio to the floor (CPU, WAL) |\n|---|---|---:|---:|---|")
        meter = Meter(pg.url)
        for run in range(1, args.repeat + 1):
            fresh(pg.url, args.messages, args.size)
            fl = Cost()
            run_floor(pg.url, meter, args.per_trigger, fl)
            fresh(pg.url, args.messages, args.size)
            costs = {"claim": Cost(), "read": Cost(), "acknowledge": Cost()}
            run_prepared(pg.url, meter, args.per_trigger, costs)
            total = Cost()
            for c in costs.values():
                total.add(c)
            total.rows = costs["claim"].rows
            n = args.messages
            print(f"| {run} | floor: DELETE ... RETURNING the rows | {fl.pg / n * 1e6:.1f} | {fl.wal / n:,.0f} | |")
            for name, c in costs.items():
                print(f"| {run} | prepared: {name} | {c.pg / n * 1e6:.1f} | {c.wal / n:,.0f} | |")
            print(f"| {run} | **prepared: claim + read + acknowledge** | {total.pg / n * 1e6:.1f} | {total.wal / n:,.0f} |"
                  f" {total.pg / fl.pg:.2f}x, {total.wal / fl.wal:.2f}x |")
        meter.close()
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
