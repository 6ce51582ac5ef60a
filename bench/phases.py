"""Per-phase cost of the connector's design (claim table; staged and inline sends), transport driven directly.

Per --per-trigger messages (1 KB random bodies): claim (Receiver.latest), read (read_chunks +
decoding into Arrow, as a Spark task reads; also split into fetch / decode), ack (Receiver.ack), stage
(stage_partition with inlineBytes 0) and dispatch (Dispatcher.dispatch) of staged rows; the same rows
sent inline (the default for tasks up to inlineBytes): the task (builds the rows, writes nothing),
handing them to the driver (pickling the report both ways, as Spark carries commit messages) and the
dispatch (COPY straight into the destination, with the batch's outbox record), the floor (one
DELETE ... FOR UPDATE SKIP LOCKED ... RETURNING transaction fetched into Python), and with Spark (--skip-spark leaves them out):
Spark's own floor (prebuilt record batches of our schema through a Python stream source to a noop
sink, no database) and the connector's steady-state drain batch (a noop stream, claims made ahead;
its trigger time per batch after the first two). Each: wall s, client
CPU (process_time), PostgreSQL CPU (utime + stime of the postmaster and its children in /proc, the
ended ones through its cutime + cstime; the server must run on this machine) and WAL bytes.
A repetition resets the tables, fills the queues, runs a CHECKPOINT before each run (receive, floor,
send, Spark) and drains --messages a batch at a time; a phase's figures are summed over its batches
and scaled to --per-trigger messages. The table shows the median of the repetitions per column.

    python bench/phases.py [--messages 200000] [--per-trigger 50000] [--size 1024] [--repeat 3]

Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from spark_qtransport.connections import parse_url
from spark_qtransport.spark.options import MAX_INLINE_BYTES
from spark_qtransport.transport.operations.install import create_queues
from spark_qtransport.transport.receiving.decode import rows_batch
from spark_qtransport.transport.receiving.receiver import Receiver, read_chunks
from spark_qtransport.transport.sending.dispatch import Dispatcher, set_up_sender
from spark_qtransport.transport.sending.staging import stage_partition
from spark_qtransport.transport.settings import ReceiveSettings, SendSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import Cost, Meter, arguments, database, fill, timed  # noqa: E402

QUEUE, FLOOR, ENDPOINT, OUT, ERROR = "BenchPhases", "BenchPhasesFloor", "BenchPhasesSend", "BenchPhasesOut", "error"
QUERY = "3f1c9a57-0000-4000-8000-0000000000aa"
SEND_PHASES = ["stage", "dispatch", "inline: task", "inline: to driver", "inline: dispatch"]
PHASES = ["claim", "read", "read: fetch", "read: decode", "ack", *SEND_PHASES, "floor", "Spark floor (no database)",
          "Spark drain batch (noop)"]
MB = 2**20


def reset(url: str, *fill_queues: str, n: int = 0, size: int = 0) -> None:
    """Drop every table of the run, create the queues, fill `fill_queues` with n messages each."""
    tables = [QUEUE, f"{QUEUE}.Claims", FLOOR, OUT, ERROR, *(f"{ENDPOINT}.{s}" for s in ("Staging", "Outbox", "Delayed"))]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS " + ", ".join(f'"{t}"' for t in tables))
    create_queues(parse_url(url), QUEUE, FLOOR, OUT, ERROR)
    for queue in fill_queues:
        fill(url, queue, n, size, random_bodies=True)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'VACUUM ANALYZE "{queue}"')


def read_batch(receiver: Any, start: Any, end: Any, costs: dict[str, Cost]) -> int:
    """Read a planned batch the way a Spark task does, timing its fetches and its decoding into Arrow apart."""
    n = 0
    for part in receiver.slices(start, end):
        chunks = read_chunks(part)
        while True:
            with timed(costs["read: fetch"]):
                rows = next(chunks, None)
            if rows is None:
                break
            with timed(costs["read: decode"]):
                rows_batch(part.queue, rows)
            n += len(rows)
    return n


def receive(url: str, meter: Meter, per_trigger: int, costs: dict[str, Cost]) -> int:
    """Claim, read and acknowledge the queue's messages batch by batch."""
    r = Receiver(ReceiveSettings.create(url, QUEUE, error_queue=ERROR, claim_ahead=False, max_messages=per_trigger))
    try:
        start = r.initial_offset()  # connects and sets up: not a phase
        meter.checkpoint()
        while True:
            claim = Cost()
            with meter.measure(claim):
                end = r.latest(start, per_trigger)
            if end == start:  # the empty queue's peek: not a batch's cost
                return costs["claim"].rows
            costs["claim"].add(claim)
            with meter.measure(costs["read"]):
                n = read_batch(r, start, end, costs)
            with meter.measure(costs["ack"]):
                r.ack(end)
            for phase in ("claim", "read", "read: fetch", "read: decode", "ack"):
                costs[phase].rows += n
            start = end
    finally:
        r.close()


def floor(url: str, meter: Meter, per_trigger: int, cost: Cost) -> int:
    """The least a batch receive can do: one DELETE ... RETURNING transaction, rows into Python."""
    sql = (f'DELETE FROM "{FLOOR}" WHERE seq IN (SELECT seq FROM "{FLOOR}" ORDER BY seq LIMIT {per_trigger} '
           "FOR UPDATE SKIP LOCKED) RETURNING id, headers, body")
    meter.checkpoint()
    with psycopg.connect(url) as conn:
        while True:
            batch = Cost()
            with meter.measure(batch):
                with conn.cursor(binary=True) as cur:
                    rows = cur.execute(sql).fetchall()
                conn.commit()
            if not rows:
                return cost.rows
            batch.rows = len(rows)
            cost.add(batch)


def send(url: str, meter: Meter, n: int, size: int, per_trigger: int, costs: dict[str, Cost]) -> None:
    """Send n messages a batch of per_trigger rows at a time, staged and inline."""
    staged = SendSettings.create(url, ENDPOINT, destination=OUT, error_queue=ERROR, inline_bytes=0)
    inline = SendSettings.create(url, ENDPOINT, destination=OUT, error_queue=ERROR, inline_bytes=MAX_INLINE_BYTES)
    plan = set_up_sender(staged)
    dispatcher = Dispatcher(staged)
    dispatcher.session.connection()  # connecting is not a phase
    meter.checkpoint()
    headers = {"NServiceBus.ConversationId": str(uuid.uuid4()), "NServiceBus.OriginatingEndpoint": "Shop.Web"}
    try:
        for batch, first in enumerate(range(0, n, per_trigger)):
            rows = [{"message_id": str(uuid.uuid4()), "message_type": "Shop.Messages.PlaceOrder, Shop.Messages",
                     "headers": headers, "body": os.urandom(size)} for _ in range(min(per_trigger, n - first))]
            tasks = [rows[: len(rows) // 2], rows[len(rows) // 2:]]  # 2 tasks a batch, as Spark runs it on local[2]
            with meter.measure(costs["stage"]):
                reports = [stage_partition(staged, plan, [t], batch_id=2 * batch, query_id=QUERY) for t in tasks]
            with meter.measure(costs["dispatch"]):
                result = dispatcher.dispatch(2 * batch, list(reports), query_id=QUERY)
            assert result.sent == len(rows) and reports[0].inline is None, (result, len(rows))
            with meter.measure(costs["inline: task"]):
                reports = [stage_partition(inline, plan, [t], batch_id=2 * batch + 1, query_id=QUERY) for t in tasks]
            with meter.measure(costs["inline: to driver"]):
                reports = pickle.loads(pickle.dumps(reports, protocol=pickle.HIGHEST_PROTOCOL))
            with meter.measure(costs["inline: dispatch"]):
                result = dispatcher.dispatch(2 * batch + 1, list(reports), query_id=QUERY)
            assert result.sent == len(rows) and reports[0].inline is not None, (result, len(rows))
            for phase in SEND_PHASES:
                costs[phase].rows += len(rows)
    finally:
        dispatcher.close()


def spark_floor(spark: Any, per_trigger: int, size: int, cost: Cost, *, batches: int = 4) -> None:
    """Spark's own cost of a micro-batch of our schema, without a database: a Python stream source
    whose tasks yield prebuilt record batches (`rows_batch` of 5,000 NServiceBus-shaped rows, built
    once per task) to a noop sink, 2 tasks per batch as the connector plans on local[2]. Steady
    state: the mean trigger time of the batches after the first."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from spark_qtransport.spark.schema import SCHEMA

    per_task, slices = 5_000, 2

    class Slice(InputPartition):
        pass

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self) -> None:
            self.n = 0

        def initialOffset(self) -> dict[str, int]:
            return {"batch": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
            self.n = min(self.n + 1, batches + 1)
            return {"batch": self.n}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def partitions(self, start: Any, end: Any) -> list[InputPartition]:
            return [Slice(i) for i in range(slices)]

        def read(self, partition: Any) -> Any:
            import datetime as dt
            import json as js
            import os as _os
            import uuid as _uuid

            import pyarrow as pa

            from spark_qtransport.transport.receiving.decode import ARROW_SCHEMA, rows_batch

            headers = js.dumps({"NServiceBus.MessageId": str(_uuid.uuid4()), "NServiceBus.MessageIntent": "Send",
                                "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages",
                                "NServiceBus.TimeSent": "2026-11-22 00:00:00:000000 Z",
                                "NServiceBus.ConversationId": str(_uuid.uuid4()),
                                "NServiceBus.OriginatingEndpoint": "Shop.Web", "NServiceBus.ReplyToAddress": "Shop.Web"})
            claimed = dt.datetime(2026, 11, 23)
            batch = rows_batch("Bench", [(i, str(_uuid.uuid4()), None, headers, _os.urandom(size), i, claimed)
                                         for i in range(per_task)])
            yield pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
            for _ in range(per_trigger // slices // per_task):
                yield batch

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sparkfloor"

        def schema(self) -> Any:
            return SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return FloorReader()

    spark.dataSource.register(FloorSource)
    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    q = (spark.readStream.format("sparkfloor").load().writeStream.format("noop")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination()
    shutil.rmtree(ckpt, ignore_errors=True)
    steady = [p for p in q.recentProgress if p["numInputRows"]][1:]
    cost.add(Cost(wall=sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000, client=float("nan"),
                  rows=sum(p["numInputRows"] for p in steady)))


def spark_drain(spark: Any, url: str, meter: Meter, n: int, size: int, per_trigger: int, cost: Cost) -> None:
    """The connector end to end in steady state: a noop stream draining n messages, per_trigger a
    batch, claims made ahead; the batches after the first two (worker start-up) count. Its
    PostgreSQL CPU and WAL are the whole drain's, scaled to the counted batches."""
    reset(url, QUEUE, n=n, size=size)
    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-")
    df = (spark.readStream.format("sqlqueue").option("url", url).option("queue", QUEUE)
          .option("maxMessagesPerTrigger", str(per_trigger)).load())
    whole = Cost()
    meter.checkpoint()
    with meter.measure(whole):
        q = df.writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        q.awaitTermination()
    shutil.rmtree(ckpt, ignore_errors=True)
    busy = [p for p in q.recentProgress if p["numInputRows"]]
    assert sum(p["numInputRows"] for p in busy) == n, busy
    steady = busy[2:]
    rows = sum(p["numInputRows"] for p in steady)
    share = rows / n
    cost.add(Cost(wall=sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000, client=float("nan"),
                  pg=whole.pg * share, wal=whole.wal * share, rows=rows))


def repetition(url: str, args: Any) -> dict[str, Cost]:
    """One run of every phase over --messages messages, on fresh tables."""
    costs = {p: Cost() for p in PHASES}
    with contextlib.closing(Meter(url)) as meter:
        reset(url, QUEUE, FLOOR, n=args.messages, size=args.size)
        got = receive(url, meter, args.per_trigger, costs)
        assert got == args.messages, (got, args.messages)
        got = floor(url, meter, args.per_trigger, costs["floor"])
        assert got == args.messages, (got, args.messages)
        send(url, meter, args.messages, args.size, args.per_trigger, costs)
        if args.spark is not None:
            spark_floor(args.spark, args.per_trigger, args.size, costs["Spark floor (no database)"])
            spark_drain(args.spark, url, meter, args.messages, args.size, args.per_trigger, costs["Spark drain batch (noop)"])
    return costs


def table(reps: list[dict[str, Cost]], per_trigger: int) -> dict[str, Cost]:
    """Print the Markdown table of the medians per --per-trigger messages; returns them."""
    med = {p: Cost.median([rep[p].scaled(per_trigger) for rep in reps]) for p in PHASES}
    print(f"Per {per_trigger:,} messages, median of {len(reps)} repetitions (each column separately):\n")
    print("| phase | wall s | client CPU s | PostgreSQL CPU s | WAL MB | msg/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, c in med.items():
        apart = p.startswith("read: ")  # the server's share of a read is all in its fetches
        if c.wall:
            print(f"| {p} | {c.wall:.2f} | {_n(c.client, '.2f')} | {_n(c.pg, '.2f', apart)} |"
                  f" {_n(c.wal / MB, '.1f', apart)} | {per_trigger / c.wall:,.0f} |")
    return med


def _n(v: float, fmt: str, blank: bool = False) -> str:
    return "–" if blank or v != v else format(v, fmt)


def ratios(med: dict[str, Cost]) -> None:
    path = [med[p] for p in ("claim", "read", "ack")]
    fl = med["floor"]
    wall, pg, client = (sum(getattr(c, a) for c in path) for a in ("wall", "pg", "client"))
    print(f"\nclaim + read + ack: {wall:.2f} s wall, {client:.2f} s client CPU, {pg:.2f} s PostgreSQL CPU;"
          f" floor {fl.wall:.2f} s, {fl.client:.2f} s, {fl.pg:.2f} s")
    print(f"ratio claim + read + ack / floor: {wall / fl.wall:.2f}x wall, {pg / fl.pg:.2f}x PostgreSQL CPU,"
          f" {sum(c.wal for c in path) / fl.wal:.1f}x WAL")


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; the table shows their median")
    ap.add_argument("--skip-spark", action="store_true", help="leave out the Spark rows (its own floor, the drain batch)")
    args = ap.parse_args()
    with database(args) as url:
        args.spark = None
        if not args.skip_spark:
            from _spark import session

            args.spark = session("sqlqueue-phases")
            spark_floor(args.spark, 10_000, args.size, Cost(), batches=2)  # JVM and Python worker warm-up
        reps = []
        for i in range(args.repeat):
            t = time.perf_counter()
            reps.append(repetition(url, args))
            print(f"repetition {i + 1} of {args.repeat}: {time.perf_counter() - t:.0f} s", flush=True)
        print()
        ratios(table(reps, args.per_trigger))
        if args.spark is not None:
            args.spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
