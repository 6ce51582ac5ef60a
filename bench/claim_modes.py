"""The claim modes against their floors, on two servers: the speed table for `claimMode` table and
prepared, on the embedded PostgreSQL as tuned and on one with PostgreSQL's default WAL settings.

`claimMode` table copies every claimed message into the claim table (a second durable write of each
body) and deletes it from there at the acknowledgement; prepared holds the claim's DELETE in a
prepared transaction (PREPARE TRANSACTION at the claim, COMMIT PREPARED at the acknowledgement), so
each message is written once. This script measures both against what the database must do at
least, on two embedded servers with fsync on, one after the other:

  tuned    `EmbeddedPostgres(fsync=True)`: the embedded default (max_wal_size 4GB,
           checkpoint_timeout 30min, wal_buffers 64MB, max_prepared_transactions 64);
  default  the same server with PostgreSQL's default WAL settings put back (max_wal_size 1GB,
           checkpoint_timeout 5min, wal_buffers -1); max_prepared_transactions stays 64, as
           `sqlqueue doctor` advises. Checkpoints come every 1 GB of WAL or 5 minutes, so a path
           of 200,000 messages meets some, and the first change to each page after one writes the
           page whole (full_page_writes).

Per server, every path on fresh queues made by NServiceBus's own PostgreSQL DDL (`_common.nsb_queue`),
the source filled by COPY with NServiceBus's headers (`_common.nsb_headers`) and --size random bytes
per message, then VACUUM ANALYZE and CHECKPOINT (`_common.settle`), then the path, metered as a whole
(`_common.Meter`: PostgreSQL CPU from /proc, WAL bytes from the LSN; the checkpoints the server made
meanwhile are counted too):

  1. floor: DELETE ... RETURNING --per-trigger rows per transaction, fetched into Python (at-least-once);
  2-3. the connector draining the queue to a noop sink, claimMode table, then prepared;
  4. floor of queue -> queue, new messages: the same DELETE, headers built in Python, binary COPY
     into the destination, one transaction per --per-trigger rows (`_common.floor_to_queue`);
  5. the connector queue -> Spark -> queue, new messages, exactly once, `destination` as the sink's
     option, each claim mode;
  6. the same with `destination` as a column (`F.lit(...)`), each claim mode;
  7. floor of auditing: the DELETE and the audit copy made on the server in one statement (a
     data-modifying CTE: INSERT INTO audit SELECT ... FROM the deleted rows, the incoming headers
     with NServiceBus's audit headers appended), one transaction per --per-trigger rows; then the
     connector draining with `auditQueue`, each claim mode;
  8. NServiceBus receive + send, one row per transaction, 2 connections, on --nsb-messages
     (--skip-nsb leaves it out, and the ratios to it).

The connector's paths: Trigger.AvailableNow, maxMessagesPerTrigger --per-trigger, metered from
before the stream is created until the source queue and its claim table are empty and no prepared
transaction is left (the last acknowledgement); msg/s is the steady state (the batches after the
first: rows / their triggerExecution, `_common.stream_rates`), the wall clock beside it. The session
is warmed up once, on the first server, with two full batches of a drain per claim mode and of
queue -> queue. After each connector path the destination (or the audit queue) must hold
--messages distinct message ids.

Then the goals, per server and claim mode, MET or NOT MET: drain PostgreSQL CPU and WAL per message
<= 1.15x the floor's and steady rate >= 0.6x the floor's; queue -> queue CPU and WAL <= 1.2x its
floor's and steady rate >= 10x NServiceBus receive + send at 2 connections, with `destination` as
option and as column; auditing CPU and WAL <= 1.3x its floor's, steady rate >= 0.8x the drain
without audit in the same claim mode.

    python bench/claim_modes.py [--messages 200000] [--per-trigger 50000] [--size 1024]
        [--servers tuned,default] [--modes table,prepared] [--skip-nsb] [--json claim_modes.json]

Always starts its own embedded servers ($SQLQUEUE_URL is not used: the point is the server's settings).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    Cost,
    Meter,
    arguments,
    counted,
    drain,
    drain_with,
    drop,
    fill,
    floor,
    floor_sql,
    floor_to_queue,
    nsb_receive_send,
    queue_to_queue,
    reset,
    settle,
)

#: server name -> the settings it starts with over EmbeddedPostgres(fsync=True)'s
SERVERS: dict[str, dict[str, str]] = {
    "tuned": {},
    # PostgreSQL's own defaults for what the embedded server sets for durability's sake
    # (spark_qtransport/cli/embedded.py: max_wal_size 4GB, checkpoint_timeout 30min, wal_buffers 64MB)
    "default": {"max_wal_size": "1GB", "checkpoint_timeout": "5min", "wal_buffers": "-1"},
}
MODES = ("table", "prepared")
#: what the server is asked about at the start, and printed
SHOWN = ("server_version", "max_wal_size", "checkpoint_timeout", "wal_buffers", "max_prepared_transactions",
         "shared_buffers", "fsync", "synchronous_commit", "full_page_writes", "wal_compression")

#: the goals: drain CPU and WAL per message <= 1.15x the floor's, steady rate >= 0.6x the floor's;
#: queue -> queue CPU and WAL <= 1.2x its floor's, steady rate >= 10x NServiceBus receive + send at 2
#: connections; auditing CPU and WAL <= 1.3x its floor's
GOAL_DRAIN_COST, GOAL_DRAIN_RATE, GOAL_QQ_COST, GOAL_QQ_NSB, GOAL_AUDIT_COST = 1.15, 0.6, 1.2, 10.0, 1.3
#: the drain with auditQueue: steady msg/s at least this much of the same claim mode's drain without it
GOAL_AUDIT_RATE = 0.8

#: the audit headers the floor of auditing appends to each copy (those `platform.after.audit_headers`
#: adds), the times once per transaction
AUDIT_HEADERS = {
    "NServiceBus.ProcessingStarted": "{time}", "NServiceBus.ProcessingEnded": "{time}",
    "$.diagnostics.hostid": "5f0c2d7e9a1b4c3d8e6f7a8b9c0d1e2f", "$.diagnostics.hostdisplayname": "SPARK-01",
    "NServiceBus.ProcessingMachine": "SPARK-01", "NServiceBus.ProcessingEndpoint": "Shop.Orders",
}


# --- metering ----------------------------------------------------------------------------------

def checkpoints(meter: Meter) -> int:
    """Checkpoints the server has made since its start (timed and requested)."""
    for sql in ("SELECT num_timed + num_requested FROM pg_stat_checkpointer",          # PostgreSQL 17+
                "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"):
        with contextlib.suppress(Exception):
            meter.conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(meter.conn.execute(sql).fetchone()[0])  # type: ignore[index]
    return -1


@contextlib.contextmanager
def metered(meter: Meter, n: int, into: dict[str, Any]) -> Iterator[None]:
    """A path metered as a whole: wall, PostgreSQL CPU and WAL (also per message), checkpoints made."""
    cost, ckpt = Cost(), checkpoints(meter)
    with meter.measure(cost):
        yield
    into.update(messages=n, metered_s=cost.wall, pg_cpu_s=cost.pg, wal_bytes=cost.wal,
                pg_cpu_us_per_msg=cost.pg / n * 1e6, wal_bytes_per_msg=cost.wal / n,
                checkpoints=checkpoints(meter) - ckpt)


def acknowledged(url: str, queue: str, timeout: float = 60.0) -> tuple[float, int]:
    """Wait until `queue` and its claim table are empty and no prepared transaction is left (the
    connector's last acknowledgement done: rows a prepared claim deleted stay visible until its
    COMMIT PREPARED); (seconds waited, messages still there at the end)."""
    import psycopg

    sql = (f'SELECT (SELECT count(*) FROM "{queue}")'
           f' + COALESCE((SELECT count(*) FROM "{queue}.Claims" WHERE to_regclass(\'"{queue}.Claims"\') IS NOT NULL), 0)'
           " + (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())")
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as c:
        if c.execute("SELECT to_regclass(%s)", (f'"{queue}.Claims"',)).fetchone()[0] is None:  # type: ignore[index]
            sql = (f'SELECT (SELECT count(*) FROM "{queue}")'
                   " + (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())")
        while (left := int(c.execute(sql).fetchone()[0])) and time.perf_counter() - t < timeout:  # type: ignore[index]
            time.sleep(0.05)
    return time.perf_counter() - t, left


def claim_table_rows(url: str, queue: str) -> int | None:
    """Rows ever inserted into the queue's claim table (pg_stat_user_tables; the statistics reach it
    within a few seconds of the sessions going idle): 0 when every claim was held by a prepared
    transaction. None without a claim table."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        time.sleep(1.5)
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
                        (f'"{queue}.Claims"',)).fetchone()
    return None if row is None else int(row[0])


# --- the floors outside Spark -------------------------------------------------------------------

def audit_floor(url: str, src: str, audit: str, n: int, per_trigger: int) -> float:
    """The floor of auditing: the floor's DELETE and the audit copy of each deleted row (a new row
    id, the incoming headers with `AUDIT_HEADERS` appended as text, the body) made on the server in
    the same statement (a data-modifying CTE), the rows fetched into Python (binary cursor), one
    transaction per `per_trigger` rows, until `src` is empty (at-least-once); msg/s."""
    from spark_qtransport.wire import format_time

    extra = json.dumps(AUDIT_HEADERS)[1:-1].replace("/", "\\/")
    sql = (f"WITH gone AS ({floor_sql(src, per_trigger)}), copied AS ("
           f' INSERT INTO "{audit}" (id, headers, body)'
           " SELECT gen_random_uuid(), left(headers, -1) || ', ' || %s || '}', body FROM gone)"
           " SELECT id, headers, body FROM gone")
    return drain_with(url, sql, n, lambda: (extra.replace("{time}", format_time(datetime.now(timezone.utc))),))


# --- one server --------------------------------------------------------------------------------

def fresh(url: str, queue: str, n: int, size: int, *also: str, endpoints: tuple[str, ...] = ()) -> None:
    """A new queue of n messages plus empty queues `also`, all by NServiceBus's DDL; VACUUM ANALYZE, CHECKPOINT."""
    reset(url, queue, *also, endpoints=endpoints, nsb=True)
    if n:
        fill(url, queue, n, size, random_bodies=True, nsb=True)
    settle(url, queue)


def warm_up(spark: Any, url: str, k: int, size: int, modes: list[str]) -> None:
    """JVM and Python workers warmed with two full batches of a drain per claim mode and of queue ->
    queue (as speed.py does; the JVM compiles the conversion of full batches only after a while)."""
    for mode in modes:
        q = f"CmWarm{mode.title()}"
        fresh(url, q, 2 * k, size, "error")
        drain(spark, url, q, 2 * k, k, {"claimMode": mode})
        acknowledged(url, q)
        drop(url, q)
    fresh(url, "CmWarmQq", 2 * k, size, "CmWarmOut", "error", endpoints=("CmWarmQq",))
    queue_to_queue(spark, url, "CmWarmQq", "CmWarmOut", 2 * k, k, new_messages=True, options={"claimMode": modes[-1]})
    acknowledged(url, "CmWarmQq")
    drop(url, "CmWarmQq", "CmWarmOut", endpoints=("CmWarmQq",))


def run_server(spark: Any, url: str, name: str, args: Any, modes: list[str], *, warm: bool) -> dict[str, Any]:
    """Every path on one server; its figures, keyed by path."""
    n, k, size = args.messages, args.per_trigger, args.size
    tag = f"Cm{name.title()}"  # every table of this server's paths named apart from the other server's
    meter = Meter(url)
    fig: dict[str, Any] = {"settings": {}, "paths": {}}
    with meter.conn.cursor() as cur:
        for s in SHOWN:
            with contextlib.suppress(Exception):
                fig["settings"][s] = cur.execute(f"SHOW {s}").fetchone()[0]  # type: ignore[index]
    print(f"server {name}: " + ", ".join(f"{s} {v}" for s, v in fig["settings"].items()), flush=True)
    paths = fig["paths"]

    def step(what: str) -> None:
        print(f"  [{name}] {what} ...", flush=True, file=sys.stderr)

    def plain(key: str, m: int, path: Callable[[], float]) -> None:
        r: dict[str, Any] = {}
        with metered(meter, m, r):
            r["rate"] = path()
        paths[key] = r

    def connector(key: str, src: str, mode: str, run: Callable[[], dict[str, Any]]) -> None:
        r: dict[str, Any] = {}
        with metered(meter, n, r):
            out = run()
            r["ack_wait_s"], r["left"] = acknowledged(url, src)
        r.update({k_: v for k_, v in out.items() if k_ not in ("pg_cpu_s", "wal_bytes", "metered_s")})
        r["mode"] = mode
        r["rate"] = r["steady_rate"]
        r["claim_table_rows"] = claim_table_rows(url, src)
        assert not r["left"], f"{key}: {r['left']} messages not acknowledged 60 s after the query ended"
        paths[key] = r

    try:
        if warm:
            step("Spark warm-up")
            warm_up(spark, url, k, size, modes)

        step("floor")
        q = f"{tag}Floor"
        fresh(url, q, n, size)
        plain("floor", n, lambda: floor(url, q, n, k))
        drop(url, q)

        for mode in modes:
            step(f"connector drain -> noop, claimMode {mode}")
            q = f"{tag}Drain{mode.title()}"
            fresh(url, q, n, size, "error")
            connector(f"drain {mode}", q, mode,
                      lambda q=q, mode=mode: drain(spark, url, q, n, k, {"claimMode": mode}))
            drop(url, q)

        step("floor, queue -> queue, new messages")
        src, out = f"{tag}FloorIn", f"{tag}FloorOut"
        fresh(url, src, n, size, out)
        plain("floor qq", n, lambda: floor_to_queue(url, src, out, n, k, new_messages=True))
        assert counted(url, out) == (n, n)
        drop(url, src, out)

        for how in ("option", "column"):
            for mode in modes:
                step(f"connector queue -> Spark -> queue, new messages, destination as {how}, claimMode {mode}")
                src, out = f"{tag}Qq{how.title()}{mode.title()}", f"{tag}QqOut"
                fresh(url, src, n, size, out, "error", endpoints=(src,))
                connector(f"qq {how} {mode}", src, mode,
                          lambda src=src, out=out, how=how, mode=mode: queue_to_queue(
                              spark, url, src, out, n, k, new_messages=True, options={"claimMode": mode},
                              destination_column=how == "column"))
                drop(url, src, out, endpoints=(src,))

        step("floor of auditing")
        src, audit = f"{tag}AuditFloorIn", f"{tag}AuditFloor"
        fresh(url, src, n, size, audit)
        plain("floor audit", n, lambda: audit_floor(url, src, audit, n, k))
        assert counted(url, audit) == (n, n)
        drop(url, src, audit)

        for mode in modes:
            step(f"connector drain with auditQueue, claimMode {mode}")
            src, audit = f"{tag}AuditIn", f"{tag}Audit"
            fresh(url, src, n, size, audit, "error")
            connector(f"audit {mode}", src, mode,
                      lambda src=src, audit=audit, mode=mode: drain(
                          spark, url, src, n, k, {"claimMode": mode, "auditQueue": audit}))
            got = counted(url, audit)
            assert got == (n, n), f"the audit queue holds {got[0]:,} rows, {got[1]:,} distinct ids; expected {n:,}"
            drop(url, src, audit)

        if not args.skip_nsb:
            m = args.nsb_messages
            step(f"NServiceBus receive + send, 2 connections, {m:,} messages")
            src, out = f"{tag}NsbIn", f"{tag}NsbOut"
            fresh(url, src, m, size, out)
            plain("nsb", m, lambda: nsb_receive_send(url, src, out, m, 2))
            assert counted(url, out) == (m, m)
            drop(url, src, out)
    finally:
        meter.close()
    return fig


# --- the table and the goals --------------------------------------------------------------------

def rows_of(paths: dict[str, Any], k: int) -> list[tuple[str, str, str | None, bool]]:
    """(label, key, floor key, ratio to NServiceBus) for the paths measured, in the table's order."""
    out: list[tuple[str, str, str | None, bool]] = [
        (f"floor: `DELETE ... RETURNING` {k:,} per transaction (at-least-once)", "floor", None, False)]
    out += [(f"connector drain -> noop, steady, claimMode {m}", f"drain {m}", "floor", False)
            for m in MODES if f"drain {m}" in paths]
    out.append(("floor, queue -> queue, new messages: DELETE, headers built in Python, COPY, one transaction",
                "floor qq", None, True))
    for how in ("option", "column"):
        out += [(f"connector queue -> Spark -> queue, new messages, destination as {how}"
                 f"{' (`F.lit`)' if how == 'column' else ''}, claimMode {m}", f"qq {how} {m}", "floor qq", True)
                for m in MODES if f"qq {how} {m}" in paths]
    out.append(("floor of auditing: `DELETE ... RETURNING` + `INSERT INTO audit SELECT` in one CTE",
                "floor audit", None, False))
    out += [(f"connector drain with auditQueue, claimMode {m}", f"audit {m}", "floor audit", False)
            for m in MODES if f"audit {m}" in paths]
    if "nsb" in paths:
        out.append(("NServiceBus receive + send, 1 row per transaction, 2 connections", "nsb", None, False))
    return out


def ratios(paths: dict[str, Any]) -> None:
    """Each connector path's ratios to its floor (rate, CPU, WAL) and to NServiceBus, into the path."""
    for key, r in paths.items():
        ref = {"drain": "floor", "qq": "floor qq", "audit": "floor audit"}.get(key.split()[0])
        if ref is None or key == ref:
            continue
        f = paths[ref]
        r["x_floor"] = {"rate": r["rate"] / f["rate"], "cpu": r["pg_cpu_us_per_msg"] / f["pg_cpu_us_per_msg"],
                        "wal": r["wal_bytes_per_msg"] / f["wal_bytes_per_msg"]}
    if "nsb" in paths:
        for key, r in paths.items():
            if key.startswith(("qq ", "floor qq")):
                r["x_nsb"] = r["rate"] / paths["nsb"]["rate"]


def table(name: str, fig: dict[str, Any], k: int) -> None:
    paths = fig["paths"]
    ratios(paths)
    s = fig["settings"]
    print(f"\n### server {name}: max_wal_size {s.get('max_wal_size')}, checkpoint_timeout {s.get('checkpoint_timeout')},"
          f" wal_buffers {s.get('wal_buffers')}, max_prepared_transactions {s.get('max_prepared_transactions')}"
          f" (PostgreSQL {s.get('server_version')}, fsync {s.get('fsync')})\n")
    print("| path | msg/s | DB CPU µs/msg | WAL B/msg | / its floor: msg/s, CPU, WAL | / NServiceBus"
          " | checkpoints during | claim-table rows |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for label, key, _ref, _nsb in rows_of(paths, k):
        r = paths[key]
        rate = (f"{r['rate']:,.0f} ({r['wall_rate']:,.0f} wall)" if "wall_rate" in r else f"{r['rate']:,.0f}")
        x = r.get("x_floor")
        xs = f"{x['rate']:.2f}x, {x['cpu']:.2f}x, {x['wal']:.2f}x" if x else ""
        nsb = f"{r['x_nsb']:.1f}x" if "x_nsb" in r else ""
        tabled = r.get("claim_table_rows")
        print(f"| {label} | {rate} | {r['pg_cpu_us_per_msg']:,.1f} | {r['wal_bytes_per_msg']:,.0f} | {xs} | {nsb}"
              f" | {r['checkpoints']} | {'' if tabled is None else f'{tabled:,}'} |")


def goals(name: str, fig: dict[str, Any], modes: list[str]) -> list[tuple[str, str, bool | None]]:
    """(goal, the figure, met; None: not measured)."""
    paths = fig["paths"]
    out: list[tuple[str, str, bool | None]] = []

    def cost(key: str, what: str, limit: float) -> None:
        x = paths[key]["x_floor"]
        for part, label in (("cpu", "CPU"), ("wal", "WAL")):
            out.append((f"{name}, {what}: {label}/msg <= {limit:g}x its floor", f"{x[part]:.2f}x", x[part] <= limit))

    for mode in modes:
        key = f"drain {mode}"
        cost(key, f"drain, claimMode {mode}", GOAL_DRAIN_COST)
        x = paths[key]["x_floor"]["rate"]
        out.append((f"{name}, drain, claimMode {mode}: steady >= {GOAL_DRAIN_RATE:g}x floor msg/s", f"{x:.2f}x",
                    x >= GOAL_DRAIN_RATE))
    for how in ("option", "column"):
        for mode in modes:
            key = f"qq {how} {mode}"
            what = f"queue -> queue, destination as {how}, claimMode {mode}"
            cost(key, what, GOAL_QQ_COST)
            x = paths[key].get("x_nsb")
            out.append((f"{name}, {what}: steady >= {GOAL_QQ_NSB:g}x NServiceBus receive + send at 2 connections",
                        "--skip-nsb" if x is None else f"{x:.1f}x",
                        None if x is None else x >= GOAL_QQ_NSB))
    for m in modes:
        if f"audit {m}" in paths:
            cost(f"audit {m}", f"auditQueue, claimMode {m}", GOAL_AUDIT_COST)
            x = paths[f"audit {m}"]["rate"] / paths[f"drain {m}"]["rate"]
            out.append((f"{name}, auditQueue, claimMode {m}: steady >= {GOAL_AUDIT_RATE:g}x the drain without it",
                        f"{x:.2f}x", x >= GOAL_AUDIT_RATE))
    return out


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--servers", default="tuned,default", help="comma-separated, of: " + ", ".join(SERVERS))
    ap.add_argument("--modes", default="table,prepared", help="claim modes, comma-separated, of: " + ", ".join(MODES))
    ap.add_argument("--skip-nsb", action="store_true", help="leave out NServiceBus receive + send (and its ratios)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args()
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    modes = [m.strip().lower() for m in args.modes.split(",") if m.strip()]
    if bad := [s for s in servers if s not in SERVERS] + [m for m in modes if m not in MODES]:
        ap.error(f"unknown server or claim mode: {', '.join(bad)}")
    modes = [m for m in MODES if m in modes]  # table first, as in the table
    if not servers or not modes:
        ap.error("--servers and --modes need at least one each")

    from _spark import session

    from spark_qtransport.cli.embedded import EmbeddedPostgres

    print(f"claim modes {', '.join(modes)} on servers {', '.join(servers)}: embedded PostgreSQL, fsync on; cores:"
          f" {os.cpu_count()}")
    print(f"messages: {args.messages:,} x {args.size} B random bodies, NServiceBus headers, NServiceBus's DDL;"
          f" maxMessagesPerTrigger {args.per_trigger:,}"
          + ("" if args.skip_nsb else f"; NServiceBus on {args.nsb_messages:,}") + "\n", flush=True)
    fig: dict[str, Any] = {"messages": args.messages, "size": args.size, "per_trigger": args.per_trigger,
                           "nsb_messages": None if args.skip_nsb else args.nsb_messages, "modes": modes,
                           "cores": os.cpu_count(), "servers": {}}
    t = time.perf_counter()
    spark = session("sqlqueue-claim-modes")
    fig["spark_master"] = spark.sparkContext.master
    try:
        for i, name in enumerate(servers):
            pg = EmbeddedPostgres(fsync=True, settings=SERVERS[name]).start()
            try:
                fig["servers"][name] = run_server(spark, pg.url, name, args, modes, warm=i == 0)
            finally:
                pg.stop()
    finally:
        spark.stop()
    print(f"\nall paths in {time.perf_counter() - t:.0f} s; Spark master {fig['spark_master']}")
    checks = []
    for name, f in fig["servers"].items():
        table(name, f, args.per_trigger)
        checks += goals(name, f, modes)
    print("\ngoals:\n" + "\n".join(
        f"- {g}: {'not measured' if ok is None else 'MET' if ok else 'NOT MET'} ({v})" for g, v, ok in checks))
    fig["goals"] = {g: ok for g, _, ok in checks}
    if args.json:
        for f in fig["servers"].values():
            for r in f["paths"].values():
                r.pop("durations_ms", None)
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
