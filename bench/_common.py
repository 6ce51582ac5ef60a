"""What the benchmarks share: their arguments, the database, what a path costs (`Meter`: PostgreSQL
CPU and WAL), filling and resetting queues, and the measured paths (the NServiceBus way, the floor,
the connector) that more than one script runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any


def arguments(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--per-trigger", type=int, default=50_000)
    ap.add_argument("--nsb-messages", type=int, default=20_000, help="messages for the one-row baseline")
    return ap


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    """$SQLQUEUE_URL, else an embedded PostgreSQL with fsync on (durable commits); prints which."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    url = os.environ.get("SQLQUEUE_URL")
    pg = None if url else EmbeddedPostgres(fsync=True).start()
    try:
        print(f"PostgreSQL: {'embedded, fsync on' if pg else 'from SQLQUEUE_URL'}; cores: {os.cpu_count()}")
        print(f"messages: {args.messages:,} x {args.size} B bodies; maxMessagesPerTrigger {args.per_trigger:,}\n")
        yield url or pg.url  # type: ignore[union-attr]
    finally:
        if pg is not None:
            pg.stop()


#: NServiceBus's message type as an NServiceBus endpoint writes it: assembly-qualified
NSB_MESSAGE_TYPE = "Shop.Messages.PlaceOrder, Shop.Messages, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"


def nsb_headers(message_id: str | None = None) -> str:
    """The headers text of a new message as an NServiceBus endpoint sends it: 13 headers, about 800
    bytes of JSON with `/` escaped as `\\/`; new message, conversation and trace ids each call
    (CorrelationId = MessageId, as for a message sent outside a handler)."""
    mid = message_id or str(uuid.uuid4())
    return json.dumps({
        "NServiceBus.MessageId": mid,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": mid,
        "NServiceBus.ReplyToAddress": "Shop.Web",
        "NServiceBus.OriginatingMachine": "SHOP-WEB-01",
        "NServiceBus.OriginatingEndpoint": "Shop.Web",
        "$.diagnostics.originating.hostid": "3f2a9c1e7b5d4e08a6c2f1d09e8b7a65",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": NSB_MESSAGE_TYPE,
        "NServiceBus.Version": "9.2.3",
        "NServiceBus.TimeSent": "2026-11-22 00:00:00:000000 Z",
        "traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01",
    }).replace("/", "\\/")


def fill(url: str, queue: str, n: int, size: int, *, random_bodies: bool = False, nsb: bool = False) -> float:
    """Insert n messages with NServiceBus-shaped headers using COPY; returns seconds taken.
    Bodies are `size` repeated bytes, or with `random_bodies` `size` random bytes each (incompressible).
    With `nsb` each message has the headers an NServiceBus endpoint writes (`nsb_headers`: 13, about
    800 bytes, its own ids); else 8 shorter ones with a unique MessageId."""
    import psycopg

    headers = json.dumps({
        "NServiceBus.MessageId": "x", "NServiceBus.MessageIntent": "Send",
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages",
        "NServiceBus.ContentType": "application/json", "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.TimeSent": "2026-11-22 00:00:00:000000 Z", "NServiceBus.OriginatingEndpoint": "Shop.Web",
        "NServiceBus.ReplyToAddress": "Shop.Web",
    })
    body = b"x" * size
    t = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f'COPY "{queue}" (id, headers, body) FROM STDIN') as copy:
            for _ in range(n):
                copy.write_row((uuid.uuid4(),
                                nsb_headers() if nsb else headers.replace('"x"', f'"{uuid.uuid4()}"', 1),
                                os.urandom(size) if random_bodies else body))
    return time.perf_counter() - t


# --- what a measured path costs: wall, client CPU, PostgreSQL CPU, WAL --------------------------

@dataclass
class Cost:
    """What one phase cost: seconds, CPU seconds, WAL bytes, and the messages it handled."""

    wall: float = 0.0
    client: float = 0.0
    pg: float = 0.0
    wal: float = 0.0
    rows: int = 0

    def add(self, other: Cost) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def scaled(self, rows: int) -> Cost:
        k = rows / self.rows if self.rows else 0.0
        return Cost(self.wall * k, self.client * k, self.pg * k, self.wal * k, rows)

    @staticmethod
    def median(runs: list[Cost]) -> Cost:
        return Cost(*(statistics.median(getattr(c, f.name) for c in runs) for f in fields(Cost)))  # type: ignore[arg-type]


class Meter:
    """Reads the server's CPU and WAL position around a phase or a path, on a connection of its own
    (the server must run on this machine for its CPU: /proc).

    The CPU is the whole server's: the postmaster and every process it forked, live or exited
    (backends, the checkpointer, the background and WAL writers, autovacuum's launcher and
    workers, I/O workers, parallel workers), as the acceptance run counts it. A live child is read
    from its /proc/<pid>/stat (utime + stime, plus cutime + cstime of any child of its own it
    reaped); an exited one from the postmaster's cutime + cstime, which the kernel adds each reaped
    child's CPU (its children's included) to. So a backend whose connection closed during the
    phase, an autovacuum worker that came and went, or a checkpoint all count."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        (backend,) = self.conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        self.postmaster = int(_stat(backend)[1]) if _stat(backend) else None
        self.tick = os.sysconf("SC_CLK_TCK")

    def pg_cpu(self) -> float:
        """CPU seconds of the postmaster and every process it forked, live (utime + stime + cutime
        + cstime) or exited (the postmaster's cutime + cstime). Read again while the postmaster's
        cutime + cstime moves during the scan: a child reaped between reading the postmaster and
        scanning the children would be counted by neither (or, reaped after it was scanned, twice)."""
        if self.postmaster is None:
            return float("nan")
        for _ in range(10):
            own = _stat(self.postmaster) or []
            ticks = sum(int(v) for v in own[11:15])
            for pid in os.listdir("/proc"):
                if pid.isdigit() and (s := _stat(int(pid))) and int(s[1]) == self.postmaster:
                    ticks += sum(int(v) for v in s[11:15])
            if (_stat(self.postmaster) or [])[13:15] == own[13:15]:
                break
        return ticks / self.tick

    def wal(self) -> int:
        (lsn,) = self.conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()  # type: ignore[misc]
        return int(lsn)

    def close(self) -> None:
        self.conn.close()

    def checkpoint(self) -> None:
        self.conn.execute("CHECKPOINT")

    @contextlib.contextmanager
    def measure(self, into: Cost) -> Iterator[None]:
        pg, wal = self.pg_cpu(), self.wal()
        with timed(into):
            yield
        into.pg += self.pg_cpu() - pg
        into.wal += self.wal() - wal


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (index 1: ppid, 11-14: CPU ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


@contextlib.contextmanager
def timed(into: Cost) -> Iterator[None]:
    """Wall and client CPU only: for the parts of a read, which the server does not see apart."""
    wall, client = time.perf_counter(), time.process_time()
    yield
    into.wall += time.perf_counter() - wall
    into.client += time.process_time() - client


# --- tables: a fresh queue for every measured path ---------------------------------------------

#: NServiceBus's PostgreSQL transport's queue table (its CreateQueueText): seq is serial, int4
NSB_QUEUE_DDL = ('CREATE TABLE "{0}" (id uuid NOT NULL PRIMARY KEY, expires timestamp, headers text NOT NULL, '
                 "body bytea, seq serial NOT NULL UNIQUE)")


def nsb_queue(url: str, *names: str) -> None:
    """Create the queues as NServiceBus's PostgreSQL transport does (`NSB_QUEUE_DDL`), nothing else:
    the connector creates its companion tables (claims, staging, outbox, delayed) itself."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for name in names:
            c.execute(NSB_QUEUE_DDL.format(name))


def reset(url: str, *queues: str, endpoints: tuple[str, ...] = (), nsb: bool = False) -> None:
    """Drop the queues (with their claim tables) and the endpoints' Staging / Outbox / Delayed
    tables, then create the queues again, empty: with our installer, or with `nsb` with
    NServiceBus's DDL (`nsb_queue`)."""

    from spark_qtransport.connections import parse_url
    from spark_qtransport.transport import create_queues

    drop(url, *queues, endpoints=endpoints)
    if nsb:
        nsb_queue(url, *queues)
    else:
        create_queues(parse_url(url), *queues)


def drop(url: str, *queues: str, endpoints: tuple[str, ...] = ()) -> None:
    """Drop what `reset` creates (after a path, so the next starts on a small database)."""
    import psycopg

    tables = [*queues, *(f"{q}.Claims" for q in queues),
              *(f"{e}.{s}" for e in endpoints for s in ("Staging", "Outbox", "Delayed"))]
    with psycopg.connect(url, autocommit=True) as c:
        let_go_prepared(c)
        c.execute("DROP TABLE IF EXISTS " + ", ".join(f'"{t}"' for t in tables))


def let_go_prepared(conn: Any) -> None:
    """Roll back the connector's prepared claims on the bench's own database. A stream stopped by
    `query.stop()` leaves its last batch's claim prepared (pyspark does not call the source's stop:
    its warden parks it half a `preparedClaimTimeout` later), and the claim holds its queue's ROW
    EXCLUSIVE lock: a DROP would wait for it, and the warden's park, which reads the queue, would
    queue behind the DROP, for ever. The messages of a bench are not kept."""
    from psycopg import errors

    from spark_qtransport.dialects.postgres import PostgresDialect

    held = conn.execute("SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database()"
                        " AND gid LIKE 'sqlqueue:%'").fetchall()
    for (gid,) in held:
        try:
            conn.execute(PostgresDialect().rollback_prepared(gid).sql)
        except errors.UndefinedObject:  # parked or committed meanwhile
            pass


def settle(url: str, *queues: str, vacuum: bool = True) -> None:
    """VACUUM ANALYZE the filled queues (unless `vacuum` is false: then autovacuum may do it during
    the path, and its CPU is the path's), then CHECKPOINT: every path starts a checkpoint cycle the
    same way (the first change to each page writes it whole to WAL, as after any checkpoint)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for q in queues if vacuum else ():
            c.execute(f'VACUUM ANALYZE "{q}"')
        c.execute("CHECKPOINT")


# --- the NServiceBus way: one message per transaction, plain SQL ------------------------------

NSB_RECEIVE = (
    'DELETE FROM "{0}" rs WHERE rs.id = (SELECT id FROM "{0}" ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) '
    "RETURNING rs.id, rs.headers, rs.body"
)
NSB_SEND = 'INSERT INTO "{0}" (id, expires, headers, body) VALUES (%s, NULL, %s, %s)'


def nsb_receive(url: str, queue: str, n: int) -> float:
    """Receive the queue's n messages one per transaction on one connection (NServiceBus's receive
    SQL); msg/s."""
    import psycopg

    sql = NSB_RECEIVE.format(queue)
    got = 0
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        while True:
            row = conn.execute(sql).fetchone()
            conn.commit()
            if row is None:
                break
            got += 1
    dt = time.perf_counter() - t
    assert got == n, (got, n)
    return n / dt


def nsb_receive_send(url: str, src: str, out: str, n: int, connections: int) -> float:
    """Receive one, send one, commit (SendsAtomicWithReceive), on `connections` connections at
    once, until `src` is empty; msg/s."""
    import threading

    import psycopg

    counts = [0] * connections

    def worker(i: int) -> None:
        with psycopg.connect(url) as conn:
            while True:
                row = conn.execute(NSB_RECEIVE.format(src)).fetchone()
                if row is None:
                    conn.commit()
                    return
                conn.execute(NSB_SEND.format(out), (uuid.uuid4(), row[1], row[2]))
                conn.commit()
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    assert sum(counts) == n, (counts, n)
    return n / dt


# --- the floor: one DELETE ... RETURNING per batch, no claim table ----------------------------

#: the columns the floor returns: every column of NServiceBus's queue table (`NSB_QUEUE_DDL`), as the
#: acceptance run's floor does and as the connector reads them
FLOOR_COLUMNS = "id, expires, headers, body, seq"


def floor_sql(queue: str, per_trigger: int) -> str:
    """The floor statement: delete the queue's first `per_trigger` rows (by seq, skipping those
    locked) and return every column of them (`FLOOR_COLUMNS`: id, expires, headers, body, seq), the
    acceptance run's drain floor. (bench/phases.py keeps its own statement, which returns id,
    headers and body only.)"""
    return (f'DELETE FROM "{queue}" WHERE seq IN (SELECT seq FROM "{queue}" ORDER BY seq LIMIT {per_trigger} '
            f"FOR UPDATE SKIP LOCKED) RETURNING {FLOOR_COLUMNS}")


def floor(url: str, queue: str, n: int, per_trigger: int) -> float:
    """Drain the queue with the floor statement (`floor_sql`), fetched into Python (binary cursor),
    committed per batch, on one connection, until empty (at-least-once); msg/s."""
    return drain_with(url, floor_sql(queue, per_trigger), n)


def drain_with(url: str, sql: str, n: int, params: Callable[[], tuple[Any, ...]] = tuple) -> float:
    """Run `sql` (a DELETE ... RETURNING, with `params()` taken afresh each time), fetch its rows into
    Python (binary cursor) and commit, until it returns none; `n` rows expected; msg/s."""
    import psycopg

    got = 0
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        while True:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(sql, params() or None).fetchall()
            conn.commit()
            if not rows:
                break
            got += len(rows)
    dt = time.perf_counter() - t
    assert got == n, (got, n)
    return n / dt


#: the message type the new-message paths (floor and connector) send: an event's .NET type, as a
#: Spark job names it
SENT_MESSAGE_TYPE = "Shop.Messages.OrderAccepted, Shop.Messages"


def floor_to_queue(url: str, src: str, out: str, n: int, per_trigger: int, *, new_messages: bool) -> float:
    """The floor of queue -> queue: the floor statement, fetched into Python (binary cursor), its rows
    binary-COPYed (`copy.write_row`) into `out` with new row ids, delete and copy committed together,
    per_trigger rows per transaction, until `src` is empty (at-least-once); msg/s. With `new_messages`
    each row gets the headers of a new message built in Python (new MessageId and ConversationId,
    CorrelationId = MessageId, intent Send, ReplyToAddress, OriginatingEndpoint / Machine, ContentType,
    EnclosedMessageTypes `SENT_MESSAGE_TYPE`, TimeSent once per transaction in NServiceBus's format,
    Version: about what the connector's sink writes); else the source row's headers, passed through."""
    from datetime import datetime, timezone

    import psycopg

    from spark_qtransport.wire import format_time, uuid4_texts

    sql = floor_sql(src, per_trigger)
    copy_sql = f'COPY "{out}" (id, headers, body) FROM STDIN (FORMAT BINARY)'
    ids = uuid4_texts()
    # the run of headers every message of a transaction shares, JSON-encoded once (`/` as `\/`)
    fixed = json.dumps({
        "NServiceBus.MessageIntent": "Send", "NServiceBus.EnclosedMessageTypes": SENT_MESSAGE_TYPE,
        "NServiceBus.ContentType": "application/json", "NServiceBus.TimeSent": "{time}",
        "NServiceBus.OriginatingEndpoint": "Shop.Orders", "NServiceBus.OriginatingMachine": "SPARK-01",
        "NServiceBus.ReplyToAddress": "Shop.Orders", "NServiceBus.Version": "9.2.3",
    })[1:-1].replace("/", "\\/")
    got = 0
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        while True:
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(sql).fetchall()
                if not rows:
                    conn.commit()
                    break
                run = fixed.replace("{time}", format_time(datetime.now(timezone.utc)))
                with cur.copy(copy_sql) as copy:
                    copy.set_types(["uuid", "text", "bytea"])
                    if new_messages:
                        for _id, _expires, _headers, body, _seq in rows:
                            mid = next(ids)
                            copy.write_row((uuid.uuid4(), f'{{"NServiceBus.MessageId": "{mid}", {run}, '
                                            f'"NServiceBus.ConversationId": "{next(ids)}", '
                                            f'"NServiceBus.CorrelationId": "{mid}"}}', body))
                    else:
                        for _id, _expires, headers, body, _seq in rows:
                            copy.write_row((uuid.uuid4(), headers, body))
            conn.commit()
            got += len(rows)
    dt = time.perf_counter() - t
    assert got == n, (got, n)
    return n / dt


# --- the connector ------------------------------------------------------------------------------

def stream_rates(progress: list[dict], n: int, wall: float) -> dict:
    """Rates of a finished Trigger.AvailableNow query from its progress: wall clock (n / wall),
    micro-batch time only, and steady state (the batches after the first, which pays worker start-up)."""
    busy = [p for p in progress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in busy)
    trigger_ms = [p["durationMs"]["triggerExecution"] for p in busy]
    steady = (sum(p["numInputRows"] for p in busy[1:]) / (sum(trigger_ms[1:]) / 1000)
              if len(busy) > 1 else float("nan"))
    return {
        "rows": rows,
        "wall_rate": n / wall,
        "wall_s": wall,
        "batch_rate": rows / (sum(trigger_ms) / 1000),
        "steady_rate": steady,
        "batches": len(busy),
        "first_batch_s": trigger_ms[0] / 1000,
        "batch_ms": trigger_ms,
        "batch_rows": [p["numInputRows"] for p in busy],
        # where each batch's time went, as Spark reports it: latestOffset (our claim, or waiting
        # for the one made ahead), addBatch (the tasks: read, and for a sink stage + commit),
        # walCommit / commitOffsets (the checkpoint's offset and commit logs), queryPlanning
        "durations_ms": [{k: p["durationMs"].get(k, 0) for k in _PARTS} for p in busy],
    }


_PARTS = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def claims_empty(url: str, queue: str, timeout: float = 30.0) -> float:
    """Wait until the claim table of `queue` is empty (the query's last acknowledgement done), at
    most `timeout` seconds; the seconds waited. The query's stop() waits for the acknowledgements
    in flight; this only makes sure, before a meter is read."""
    import psycopg

    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as c:
        while (c.execute(f'SELECT EXISTS (SELECT 1 FROM "{queue}.Claims")').fetchone() or (False,))[0]:
            if time.perf_counter() - t > timeout:
                break
            time.sleep(0.05)
    return time.perf_counter() - t


@contextlib.contextmanager
def metered(meter: Meter | None, url: str, queue: str, into: dict) -> Iterator[None]:
    """With a meter: PostgreSQL CPU and WAL of a connector path, from before its query starts until
    its claim table is empty after it ended (`claims_empty`), into `into` (pg_cpu_s, wal_bytes,
    ack_wait_s, metered_s)."""
    if meter is None:
        yield
        return
    cost = Cost()
    with meter.measure(cost):
        yield
        into["ack_wait_s"] = claims_empty(url, queue)
    into.update(pg_cpu_s=cost.pg, wal_bytes=cost.wal, metered_s=cost.wall)


def drain(spark, url: str, queue: str, n: int, per_trigger: int,  # type: ignore[no-untyped-def]
          options: dict[str, str] | None = None, *, meter: Meter | None = None) -> dict:
    """The connector drains the queue's n messages: queue -> Spark -> noop sink, Trigger.AvailableNow;
    `options` are more reader options (auditQueue, forwardTo, ...). With `meter`, the database's
    CPU and WAL from the stream's creation until its last claim is acknowledged (`metered`)."""
    import shutil
    import tempfile

    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    cost: dict = {}
    with metered(meter, url, queue, cost):
        df = (spark.readStream.format("sqlqueue").option("url", url).option("queue", queue)
              .option("maxMessagesPerTrigger", str(per_trigger)).options(**(options or {})).load())
        t = time.perf_counter()
        q = df.writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        q.awaitTermination()
        wall = time.perf_counter() - t
    shutil.rmtree(ckpt, ignore_errors=True)
    r = stream_rates(q.recentProgress, n, wall)
    assert r["rows"] == n, (r["rows"], n)
    return {**r, **cost}


def queue_to_queue(spark, url: str, src: str, out: str, n: int, per_trigger: int,  # type: ignore[no-untyped-def]
                   *, new_messages: bool = False, meter: Meter | None = None,
                   options: dict[str, str] | None = None, destination_column: bool = False,
                   check: bool = True) -> dict:
    """The connector moves the n messages of `src` to `out` exactly once: queue -> Spark ->
    writeStream.format("sqlqueue") (endpoint `src`, option destination `out`, every batch dispatched
    through its outbox), Trigger.AvailableNow; checks `out` holds n distinct NServiceBus message ids.
    The stream selects body, message_id, message_type and headers (passed through: forwarded), or with
    `new_messages` only body and a literal message_type (`SENT_MESSAGE_TYPE`): the sink builds every
    header of a new message. `options` are more reader options (claimMode, ...); with
    `destination_column` the stream selects `out` as a literal `destination` column instead of the
    sink's option. With `meter`, the database's CPU and WAL from the stream's creation until
    its last claim is acknowledged (`metered`; the check is not metered). A caller that meters
    the call itself passes `check=False` and checks `out` after its meter stopped: the check reads
    every row of `out` (a JSON parse each, and with data checksums the rows' hint bits written to
    WAL), as much as a quarter of the path's own CPU and WAL."""
    import shutil
    import tempfile

    from pyspark.sql import functions as F

    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    cost: dict = {}
    with metered(meter, url, src, cost):
        df = (spark.readStream.format("sqlqueue").option("url", url).option("queue", src)
              .option("maxMessagesPerTrigger", str(per_trigger)).options(**(options or {})).load())
        df = (df.select("body", F.lit(SENT_MESSAGE_TYPE).alias("message_type")) if new_messages
              else df.select("body", F.col("message_id"), F.col("message_type"), F.col("headers")))
        if destination_column:
            df = df.withColumn("destination", F.lit(out))
        w = df.writeStream.format("sqlqueue").option("url", url).option("endpoint", src)
        if not destination_column:
            w = w.option("destination", out)
        t = time.perf_counter()
        q = w.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        q.awaitTermination()
        wall = time.perf_counter() - t
    shutil.rmtree(ckpt, ignore_errors=True)
    if check:
        got = counted(url, out)
        assert got == (n, n), (got, n)
    return {**stream_rates(q.recentProgress, n, wall), **cost}


def counted(url: str, queue: str) -> tuple[int, int]:
    """Rows of a queue, and its distinct NServiceBus message ids."""
    import psycopg

    with psycopg.connect(url) as c:
        got = c.execute(f'SELECT count(*), count(DISTINCT headers::json->>\'NServiceBus.MessageId\') FROM "{queue}"').fetchone()
    return got  # type: ignore[return-value]
