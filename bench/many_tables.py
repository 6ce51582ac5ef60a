"""The raw SQL floor of draining many tenant queues: what the server itself spends to take the same
messages from 1,000 small queue tables rather than one, without the connector, so the connector's
1,000-queue rate (`queues.py --tenants`) can be read against what the statements alone cost.

--messages messages spread over --tables tenant queue tables (NServiceBus's DDL, one schema per
tenant, as `queues.py --tenants` makes them) are drained in batches of --per-trigger messages
(each table's share of a batch: per_trigger / tables), every column returned and fetched binary,
a transaction per --per-transaction tables (the connector's `QUEUES_PER_TRANSACTION`), by:

- `statement a table`: one `DELETE ... WHERE seq IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING
  id, expires, headers, body, seq` per table, each waited for (the connector's way);
- `prepared statement a table`: the same, each prepared on the server at its first run (parsed
  and planned once a table, not once a batch);
- `pipelined`: the same statements sent without waiting (a psycopg pipeline): the round trips go,
  the server's work per statement stays;
- `one statement per transaction`: the tables of a transaction in one statement, a data-modifying
  CTE per table joined by UNION ALL: one parse, plan and execution for them all;
- `one table`: the same messages in one table (--per-trigger a statement), for the ratio.

Each prints msg/s and the server's CPU per message (the postmaster and everything it forked:
`_common.Meter`). Every table must be empty after each variant, or the script exits 1.

    python bench/many_tables.py [--tables 1000] [--messages 20000] [--per-trigger 5000] [--per-transaction 50]
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Cost, Meter, arguments, database, floor, reset, settle  # noqa: E402
from _common import fill as fill_one  # noqa: E402
from tenants import create, drop, fill, schemas  # noqa: E402

COLUMNS = "id, expires, headers, body, seq"


def take(table: str, share: int) -> str:
    """One table's part of a batch: its first `share` rows deleted and returned."""
    return (f"DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} ORDER BY seq LIMIT {int(share)}"
            f" FOR UPDATE SKIP LOCKED) RETURNING {COLUMNS}")


def per_statement(conn: Any, tables: list[str], share: int, *, prepare: bool | None = None) -> int:
    cur, n = conn.cursor(binary=True), 0
    for t in tables:
        cur.execute(take(t, share), prepare=prepare)
        n += len(cur.fetchall())
    return n


def pipelined(conn: Any, tables: list[str], share: int) -> int:
    n = 0
    with conn.pipeline():
        curs = [conn.cursor(binary=True) for _ in tables]
        for cur, t in zip(curs, tables, strict=True):
            cur.execute(take(t, share))
    for cur in curs:
        n += len(cur.fetchall())
    return n


def combined(conn: Any, tables: list[str], share: int) -> int:
    parts = [f"d{i} AS ({take(t, share)})" for i, t in enumerate(tables)]
    union = " UNION ALL ".join(f"SELECT {i} AS q, {COLUMNS} FROM d{i}" for i in range(len(tables)))
    cur = conn.cursor(binary=True)
    cur.execute(f"WITH {', '.join(parts)} {union}")
    return len(cur.fetchall())


def drain_tables(url: str, meter: Meter, tables: list[str], messages: int, per_trigger: int, per_transaction: int,
                 way: Callable[[Any, list[str], int], int]) -> Cost:
    import psycopg

    share, cost, left = max(1, per_trigger // len(tables)), Cost(rows=messages), messages
    with psycopg.connect(url) as conn, meter.measure(cost):
        while left > 0:
            got = 0
            for i in range(0, len(tables), per_transaction):
                got += way(conn, tables[i:i + per_transaction], share)
                conn.commit()
            if not got:
                break
            left -= got
    cost.rows = messages - left
    return cost


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--per-transaction", type=int, default=50)
    ap.set_defaults(messages=20_000, per_trigger=5_000)
    args = ap.parse_args()
    ways = {"statement a table": per_statement, "prepared statement a table": functools.partial(per_statement, prepare=True), "pipelined": pipelined,
            "one statement per transaction": combined}
    results: list[tuple[str, Cost]] = []
    ok = True
    with database(args) as url:
        meter = Meter(url)
        try:
            create(url, args.tables)
            tables = [f'"{s}"."audit"' for s in schemas(args.tables)]
            for name, way in ways.items():
                fill(url, args.tables, args.messages, args.size)
                meter.checkpoint()
                cost = drain_tables(url, meter, tables, args.messages, args.per_trigger, args.per_transaction, way)
                ok &= cost.rows == args.messages
                results.append((name, cost))
                print(f"  {name}: {cost.rows / cost.wall:,.0f} msg/s, {cost.pg / max(cost.rows, 1) * 1e6:.1f} µs"
                      " server CPU/msg", flush=True)
            drop(url, args.tables)
            reset(url, "BenchOneTable")
            fill_one(url, "BenchOneTable", args.messages, args.size, random_bodies=True)
            settle(url, "BenchOneTable")
            meter.checkpoint()
            cost = Cost(rows=args.messages)
            with meter.measure(cost):
                floor(url, "BenchOneTable", args.messages, args.per_trigger)
            results.append(("one table", cost))
        finally:
            meter.close()
    one = results[-1][1]
    print(f"\n{args.messages:,} messages over {args.tables:,} tables, {args.per_trigger:,} a batch,"
          f" {args.per_transaction} tables a transaction\n")
    print("| way | msg/s | x one table | server CPU µs/msg | x one table |\n|---|---:|---:|---:|---:|")
    for name, c in results:
        rate, base = c.rows / c.wall, one.rows / one.wall
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {c.pg / c.rows * 1e6:.1f} | {c.pg / c.rows / (one.pg / one.rows):.2f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
