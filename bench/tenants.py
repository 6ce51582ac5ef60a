"""`bench/queues.py --tenants 10,100,1000`: what one stream over many tenant queues costs, busy and
idle (see queues.py for what is measured). Tables by NServiceBus's DDL, one schema per tenant."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from _common import Cost, Meter, stream_rates

PATTERN = '"bench_t*"."audit"'
#: NServiceBus's PostgreSQL transport's queue table (its CreateQueueText), in a tenant's schema
QUEUE_DDL = ('CREATE TABLE "{0}"."audit" (id uuid NOT NULL PRIMARY KEY, expires timestamp, headers text NOT NULL, '
             "body bytea, seq serial NOT NULL UNIQUE)")
NOT_OURS = "query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%bench_t%.audit\" (id%'"


def schemas(n: int) -> list[str]:
    return [f"bench_t{i:04d}" for i in range(n)]


def create(url: str, n: int) -> None:
    import psycopg

    with psycopg.connect(url) as c:
        for s in schemas(n):
            c.execute(f'CREATE SCHEMA "{s}"')
            c.execute(QUEUE_DDL.format(s))
        c.execute('CREATE TABLE IF NOT EXISTS "error" (id uuid NOT NULL PRIMARY KEY, expires timestamp, '
                  "headers text NOT NULL, body bytea, seq serial NOT NULL UNIQUE)")


def fill(url: str, n: int, messages: int, size: int) -> None:
    """`messages` spread evenly over the tenants, NServiceBus-shaped headers, random bodies."""
    import os
    import uuid

    import psycopg
    from _common import nsb_headers

    with psycopg.connect(url) as c:
        for i, s in enumerate(schemas(n)):
            k = messages // n + (1 if i < messages % n else 0)
            with c.cursor().copy(f'COPY "{s}"."audit" (id, headers, body) FROM STDIN') as copy:
                for _ in range(k):
                    copy.write_row((uuid.uuid4(), nsb_headers(), os.urandom(size)))
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")


def drop(url: str, n: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for s in schemas(n):
            c.execute(f'DROP SCHEMA "{s}" CASCADE')


def statements(conn: Any) -> float:
    """Statements the server ran so far, by pg_stat_statements (NaN on a server without it)."""
    (there,) = conn.execute("SELECT to_regclass('pg_stat_statements') IS NOT NULL").fetchone()
    if not there:
        return float("nan")
    (calls,) = conn.execute(f"SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE {NOT_OURS}").fetchone()
    return int(calls)


class Watch:
    """Sampled every 100 ms while a run goes on: the most connections the connector held
    (pg_stat_activity, by its application name), the most threads of the driver's source runner
    process, the most private memory (RssAnon) one of the connector's backends held, and, given the
    postmaster, each server process's CPU as last seen alive (`cpu_by_process`: a backend's CPU is
    read before it exits, not lost into the postmaster's total of reaped children)."""

    def __init__(self, url: str, postmaster: int | None = None) -> None:
        self.url, self.postmaster = url, postmaster
        self.connections, self.threads, self.backend_mb = 0, 0, 0.0
        #: pid -> (kind, CPU seconds first seen, CPU seconds last seen)
        self.cpu: dict[int, tuple[str, float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds each kind of server process spent while watched (as last seen alive)."""
        out: dict[str, float] = {}
        for kind, first, last in self.cpu.values():
            out[kind] = out.get(kind, 0.0) + last - first
        return out

    def _sample(self) -> None:
        import psutil
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            self._processes(first=True)
            while not self._stop.wait(0.1):
                pids = [int(pid) for (pid,) in c.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'spark-qtransport'").fetchall()]
                self.connections = max(self.connections, len(pids))
                self.backend_mb = max(self.backend_mb, *(_private_mb(pid) for pid in pids), 0.0)
                for p in psutil.process_iter(["cmdline", "num_threads"]):
                    if "pyspark.sql.streaming.python_streaming_source_runner" in (p.info["cmdline"] or ()):
                        self.threads = max(self.threads, int(p.info["num_threads"] or 0))
                self._processes(first=False)

    def _processes(self, *, first: bool) -> None:
        for pid, (kind, seconds) in server_processes(self.postmaster).items():
            was = self.cpu.get(pid)
            # a process first seen after the run began spent all its CPU within it
            self.cpu[pid] = (kind, seconds if first else 0.0, seconds) if was is None else (kind, was[1], seconds)


def _private_mb(pid: int) -> float:
    """A process's private memory (RssAnon: not the server's shared buffers), in MB; 0 once gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


#: the streams' claimMode (`--claim-mode`)
CLAIM_MODE = ["auto"]
#: `--kinds`: after each busy run, the statements it ran by kind and the server's CPU by process
KINDS = [False]
#: a tenant's schema (or its claim table's) in a statement's text, so one kind is one line
TENANT = r'"bench_t[0-9]+"'


def reset_statements(conn: Any) -> None:
    """pg_stat_statements afresh before a count: after a stream over hundreds of queues the server
    has been seen to keep no entry for new plain statements (SELECT, INSERT) until a reset, which
    would leave them out of the next run's count."""
    (there,) = conn.execute("SELECT to_regclass('pg_stat_statements') IS NOT NULL").fetchone()
    if there:
        conn.execute("SELECT pg_stat_statements_reset()")


def statement_kinds(conn: Any, queue_batches: int, top: int = 18) -> list[tuple[str, float, float, float]]:
    """The statements since the last reset by kind (the tenant's schema taken out of the text):
    (kind, calls a queue a batch, planning ms, executing ms), most calls first."""
    rows = conn.execute(
        "SELECT regexp_replace(regexp_replace(query, %s, '\"T\"', 'g'), '\\s+', ' ', 'g') AS kind,"
        " sum(calls), sum(total_plan_time), sum(total_exec_time) FROM pg_stat_statements"
        f" WHERE {NOT_OURS.replace('%', '%%')} GROUP BY 1 ORDER BY 2 DESC LIMIT %s", (TENANT, top)).fetchall()
    return [(str(k), int(c) / max(queue_batches, 1), float(p), float(e)) for k, c, p, e in rows]


def server_processes(postmaster: int | None) -> dict[int, tuple[str, float]]:
    """The server's live processes: pid -> (what its title says it is: client backends, autovacuum,
    checkpointer, ...; its CPU seconds)."""
    import os

    from _common import _stat

    if postmaster is None:
        return {}
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for pid in os.listdir("/proc"):
        if not (pid.isdigit() and (s := _stat(int(pid))) and int(s[1]) == postmaster):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        kind = title.removeprefix("postgres: ").split(" ")[0] if title.startswith("postgres: ") else "other"
        out[int(pid)] = ("client backends" if kind not in _SERVER_PROCESSES else kind,
                         sum(int(v) for v in s[11:15]) / tick)
    return out


_SERVER_PROCESSES = {"checkpointer", "background", "walwriter", "autovacuum", "logical", "io", "walsummarizer",
                     "archiver", "stats", "parallel"}


def reader(spark: Any, url: str, per_trigger: int, *, one: bool = False) -> Any:
    """The stream over the tenants' queues (`queuePattern`); `one`: over the first tenant's queue
    named by `queue`, a one-queue stream (plain offsets, no count of the queues)."""
    chosen = ("queue", f'"{schemas(1)[0]}"."audit"') if one else ("queuePattern", PATTERN)
    return (spark.readStream.format("sqlqueue").option("url", url).option(*chosen)
            .option("maxMessagesPerTrigger", str(per_trigger)).option("claimMode", CLAIM_MODE[0]).load())


@contextlib.contextmanager
def checkpoint() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def busy(spark: Any, url: str, meter: Meter, n: int, messages: int, size: int, per_trigger: int, *,
         one: bool = False) -> dict[str, Any]:
    fill(url, n, messages, size)
    cost = Cost()
    reset_statements(meter.conn)  # (see `reset_statements`)
    before = statements(meter.conn)
    with Watch(url, meter.postmaster) as watch, checkpoint() as ckpt, meter.measure(cost):
        t = time.perf_counter()
        q = (reader(spark, url, per_trigger, one=one).writeStream.format("noop").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        wall = time.perf_counter() - t
    r = stream_rates(q.recentProgress, messages, wall)
    if KINDS[0]:
        print_kinds(meter, n, r["batches"], watch.cpu_by_process())
    return {**r, "pg_cpu_us_per_msg": cost.pg / messages * 1e6, "wal_bytes_per_msg": cost.wal / messages,
            "statements_per_batch": (statements(meter.conn) - before) / max(r["batches"], 1),
            "connections": watch.connections, "threads": watch.threads, "backend_mb": watch.backend_mb,
            "check": r["rows"] == messages}


def print_kinds(meter: Meter, n: int, batches: int, spent: dict[str, float]) -> None:
    """`--kinds`: what the busy run just measured ran, by statement kind, and where the server's CPU went."""
    kinds = statement_kinds(meter.conn, n * max(batches, 1))
    print(f"\n  {n:,} queues, {batches} batches: statements by kind (calls a queue a batch; planning and executing ms"
          " in all)\n  | calls/queue/batch | plan ms | exec ms | statement |\n  |---:|---:|---:|---|")
    for kind, calls, plan, run in kinds:
        print(f"  | {calls:.2f} | {plan:,.0f} | {run:,.0f} | `{kind[:110]}` |")
    print("  server CPU s by process: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
                                                     if abs(v) >= 0.005), flush=True)


def idle(spark: Any, url: str, meter: Meter, seconds: float, *, one: bool = False) -> dict[str, Any]:
    """The stream over the empty queues: every trigger's progress is kept
    (noDataProgressEventInterval 0), measured after the first few (set-up, first claims)."""
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    with Watch(url) as watch, checkpoint() as ckpt:
        q = (reader(spark, url, 1000, one=one).writeStream.format("noop").option("checkpointLocation", ckpt)
             .trigger(processingTime="500 milliseconds").start())
        try:
            deadline = time.monotonic() + 600
            while len(q.recentProgress) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            reset_statements(meter.conn)
            seen, cpu, calls = len(q.recentProgress), meter.pg_cpu(), statements(meter.conn)
            time.sleep(seconds)
            progress = q.recentProgress
            cpu, calls = meter.pg_cpu() - cpu, statements(meter.conn) - calls
            triggers = [p for p in progress[seen:] if not p["numInputRows"]]
        finally:
            q.stop()
    spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    ms = sorted(p["durationMs"]["triggerExecution"] for p in triggers)
    k = max(len(triggers), 1)
    return {"triggers": len(triggers), "trigger_ms_p50": statistics.median(ms) if ms else float("nan"),
            "trigger_ms_p90": ms[int(len(ms) * 0.9)] if ms else float("nan"),
            "latest_offset_ms_p50": statistics.median(p["durationMs"].get("latestOffset", 0) for p in triggers)
            if triggers else float("nan"),
            "statements_per_trigger": calls / k, "pg_cpu_ms_per_trigger": cpu * 1000 / k,
            "connections": watch.connections, "threads": watch.threads}


def scale(args: argparse.Namespace, counts: list[str]) -> int:
    """`counts`: numbers of tenant queues, each read by one pattern stream; `one` is one queue read
    by the `queue` option (a one-queue stream)."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    CLAIM_MODE[0], KINDS[0] = args.claim_mode, args.kinds
    settings = {"shared_preload_libraries": "pg_stat_statements", "max_connections": "100",
                "pg_stat_statements.max": "20000"}
    if args.kinds:
        settings["pg_stat_statements.track_planning"] = "on"
    pg = EmbeddedPostgres(fsync=True, settings=settings).start()
    rows = []
    try:
        import psycopg

        with psycopg.connect(pg.url, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_stat_statements")
        print(f"PostgreSQL: embedded, fsync on, max_connections {pg.settings.get('max_connections', 'default')};"
              f" {args.messages:,} x {args.size} B bodies a busy run, maxMessagesPerTrigger {args.per_trigger:,},"
              f" claimMode {args.claim_mode}\n")
        from _spark import session

        spark = session("sqlqueue-tenants")
        try:
            with contextlib.closing(Meter(pg.url)) as meter:
                for count in counts:
                    one = count == "one"
                    n = 1 if one else int(count)
                    create(pg.url, n)
                    b = busy(spark, pg.url, meter, n, args.messages, args.size, args.per_trigger, one=one)
                    i = idle(spark, pg.url, meter, args.idle_seconds, one=one)
                    rows.append(("1 (`queue`)" if one else f"{n:,}", b, i))
                    print(f"  {rows[-1][0]} queues: busy {b['steady_rate']:,.0f} msg/s steady; idle trigger"
                          f" {i['trigger_ms_p50']:.0f} ms, {i['statements_per_trigger']:.1f} statements", flush=True)
                    drop(pg.url, n)
        finally:
            spark.stop()
    finally:
        pg.stop()
    print("\n| queues | busy msg/s steady | wall msg/s | PG CPU µs/msg | WAL B/msg | statements/batch |"
          " idle trigger ms p50 / p90 | latestOffset ms p50 | statements/idle trigger | PG CPU ms/idle trigger |"
          " connections (most) | backend MB (most) | driver threads (most) | check |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for n, b, i in rows:
        print(f"| {n} | {b['steady_rate']:,.0f} | {b['wall_rate']:,.0f} | {b['pg_cpu_us_per_msg']:,.1f}"
              f" | {b['wal_bytes_per_msg']:,.0f} | {b['statements_per_batch']:,.1f}"
              f" | {i['trigger_ms_p50']:.0f} / {i['trigger_ms_p90']:.0f} | {i['latest_offset_ms_p50']:.0f}"
              f" | {i['statements_per_trigger']:.1f} | {i['pg_cpu_ms_per_trigger']:.1f}"
              f" | {max(b['connections'], i['connections'])} | {b['backend_mb']:.0f}"
              f" | {max(b['threads'], i['threads'])}"
              f" | {'ok' if b['check'] else 'CHECK FAILED'} |")
    return 0 if all(b["check"] for _, b, _ in rows) else 1
