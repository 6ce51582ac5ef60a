"""Per-phase cost of the connector's design (claim table; staged and inline sends), transport driven directly.

Every queue is made by NServiceBus's own PostgreSQL DDL (`_common.nsb_queue`) and filled with the
headers an NServiceBus endpoint writes (`_common.nsb_headers`: 13, about 800 bytes) and 1 KB random
bodies. Per --per-trigger messages: claim (Receiver.latest), read (read_chunks + decoding into
Arrow, as a Spark task reads, poison left out where the claim does not judge headers; also split
into fetch / decode), ack (Receiver.ack), stage (stage_partition with inlineBytes 0) and dispatch
(Dispatcher.dispatch) of staged rows; the same rows sent inline (the default for tasks up to
inlineBytes): the task (builds the rows, writes nothing), handing them to the driver (pickling the
report both ways, as Spark carries commit messages) and the dispatch (COPY straight into the
destination, with the batch's outbox record). The sends are of new messages: input rows of body and
message_type only, the sink builds every header (as queue -> queue with new messages); --forwarded
adds the inline way with the received messages' headers passed through. For scale: the floor (one
DELETE ... FOR UPDATE SKIP LOCKED ... RETURNING transaction fetched into Python) and the floor of
queue -> queue with new messages (`_common.floor_to_queue`: the same DELETE, new headers built in
Python, binary COPY into the destination, one transaction a batch); with Spark (--skip-spark leaves
them out): Spark's own floor (prebuilt record batches of our schema through a Python stream source
to a noop sink, no database) and the connector's steady-state drain batch (a noop stream, claims
made ahead; its trigger time per batch after the first two). Each: wall s, client CPU
(process_time), PostgreSQL CPU (utime + stime of the postmaster and its children in /proc, the
ended ones through its cutime + cstime; the server must run on this machine) and WAL bytes.
A repetition resets the tables, fills the queues, runs a CHECKPOINT before each run (receive, floor,
floor queue -> queue, send, Spark) and drains --messages a batch at a time; a phase's figures are
summed over its batches and scaled to --per-trigger messages. The table shows the median of the
repetitions per column, then claim + read + ack against the floor and the send against the COPY
part of the queue -> queue floor (that floor less the receive floor: new headers + COPY).

    python bench/phases.py [--messages 200000] [--per-trigger 50000] [--size 1024] [--repeat 3]
        [--claim-mode table|prepared]

--claim-mode prepared holds the receive's claims in prepared transactions (`claimMode`; the server
must allow them, as the embedded one does): its ack is the COMMIT PREPARED.

Runs against this package or an older one first on PYTHONPATH (`spark_qtransport.__file__` is printed).
Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL with fsync on (durable commits).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import spark_qtransport
from spark_qtransport.dialects import dialect_named
from spark_qtransport.options.parse import MAX_INLINE_BYTES
from spark_qtransport.transport.receiving.decode import rows_batch
from spark_qtransport.transport.receiving.receiver import Receiver, read_chunks
from spark_qtransport.transport.sending.dispatch import Dispatcher, set_up_sender
from spark_qtransport.transport.sending.staging import stage_partition
from spark_qtransport.transport.settings import ReceiveSettings, SendSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    SENT_MESSAGE_TYPE,
    Cost,
    Meter,
    arguments,
    database,
    fill,
    floor_to_queue,
    nsb_headers,
    reset,
    timed,
)

QUEUE, FLOOR, FLOOR_IN, FLOOR_OUT = "BenchPhases", "BenchPhasesFloor", "BenchPhasesFloorIn", "BenchPhasesFloorOut"
ENDPOINT, OUT, ERROR = "BenchPhasesSend", "BenchPhasesOut", "error"
QUERY = "3f1c9a57-0000-4000-8000-0000000000aa"
SEND_PHASES = ["stage", "dispatch", "inline: task", "inline: to driver", "inline: dispatch"]
FORWARDED = [f"{p} (forwarded headers)" for p in SEND_PHASES[2:]]
PHASES = ["claim", "read", "read: fetch", "read: decode", "ack", *SEND_PHASES, *FORWARDED, "floor",
          "floor q->q new messages", "Spark floor (no database)", "Spark drain batch (noop)"]
MB = 2**20


def fresh(url: str, n: int, size: int, *fill_queues: str) -> None:
    """Drop every table of the run and create the queues by NServiceBus's DDL; fill `fill_queues`
    with n messages each (NServiceBus's headers, random bodies), VACUUM ANALYZE them."""
    reset(url, QUEUE, FLOOR, FLOOR_IN, FLOOR_OUT, OUT, ERROR, endpoints=(ENDPOINT,), nsb=True)
    for queue in fill_queues:
        fill(url, queue, n, size, random_bodies=True, nsb=True)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'VACUUM ANALYZE "{queue}"')


def judges_reads(dialect: str) -> bool:
    """Whether a read leaves poison out (the claim did not judge headers): `ReceiveSql.poison_at_claim`;
    a package from before it judged every claim's headers (and its `rows_batch` takes no `judge`)."""
    return not getattr(dialect_named(dialect), "poison_at_claim", True)


def read_batch(receiver: Any, start: Any, end: Any, costs: dict[str, Cost]) -> int:
    """Read a planned batch the way a Spark task does (`slices.read_batches`), timing its fetches
    and its decoding into Arrow apart."""
    n = 0
    for part in receiver.slices(start, end):
        judge = {"judge": True} if judges_reads(part.dialect) else {}
        chunks = read_chunks(part)
        while True:
            with timed(costs["read: fetch"]):
                rows = next(chunks, None)
            if rows is None:
                break
            with timed(costs["read: decode"]):
                n += rows_batch(part.queue, rows, **judge).num_rows
    return n


def receive(url: str, meter: Meter, per_trigger: int, costs: dict[str, Cost], claim_mode: str = "table") -> int:
    """Claim, read and acknowledge the queue's messages batch by batch."""
    r = Receiver(ReceiveSettings.create(url, QUEUE, error_queue=ERROR, claim_ahead=False, max_messages=per_trigger,
                                        claim_mode=claim_mode))
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


def floor_q2q(url: str, meter: Meter, n: int, per_trigger: int, cost: Cost) -> None:
    """The floor of queue -> queue with new messages (`_common.floor_to_queue`), the whole drain
    (its connection and last, empty DELETE included)."""
    meter.checkpoint()
    with meter.measure(cost):
        floor_to_queue(url, FLOOR_IN, FLOOR_OUT, n, per_trigger, new_messages=True)
    cost.rows += n


def send(url: str, meter: Meter, n: int, size: int, per_trigger: int, costs: dict[str, Cost], *,
         forwarded: bool) -> None:
    """Send n new messages a batch of per_trigger rows at a time, staged and inline (with
    `forwarded`, inline again with NServiceBus's headers passed through)."""
    staged = SendSettings.create(url, ENDPOINT, destination=OUT, error_queue=ERROR, inline_bytes=0)
    inline = SendSettings.create(url, ENDPOINT, destination=OUT, error_queue=ERROR, inline_bytes=MAX_INLINE_BYTES)
    plan = set_up_sender(staged)
    dispatcher = Dispatcher(staged)
    dispatcher.session.connection()  # connecting is not a phase
    meter.checkpoint()
    batch_id = 0

    def inline_way(rows: list[dict[str, Any]], phases: list[str]) -> None:
        nonlocal batch_id
        tasks = [rows[: len(rows) // 2], rows[len(rows) // 2:]]  # 2 tasks a batch, as Spark runs it on local[2]
        with meter.measure(costs[phases[0]]):
            reports = [stage_partition(inline, plan, [t], batch_id=batch_id, query_id=QUERY, partition=i)
                       for i, t in enumerate(tasks)]
        with meter.measure(costs[phases[1]]):
            reports = pickle.loads(pickle.dumps(reports, protocol=pickle.HIGHEST_PROTOCOL))
        with meter.measure(costs[phases[2]]):
            result = dispatcher.dispatch(batch_id, list(reports), query_id=QUERY)
        assert result.sent == len(rows) and all(r.inline is not None for r in reports), (result, len(rows))
        for phase in phases:
            costs[phase].rows += len(rows)
        batch_id += 1

    try:
        for first in range(0, n, per_trigger):
            # a new message: body and message_type; the sink builds every header
            rows = [{"body": os.urandom(size), "message_type": SENT_MESSAGE_TYPE} for _ in range(min(per_trigger, n - first))]
            tasks = [rows[: len(rows) // 2], rows[len(rows) // 2:]]
            with meter.measure(costs["stage"]):
                reports = [stage_partition(staged, plan, [t], batch_id=batch_id, query_id=QUERY, partition=i)
                           for i, t in enumerate(tasks)]
            with meter.measure(costs["dispatch"]):
                result = dispatcher.dispatch(batch_id, list(reports), query_id=QUERY)
            assert result.sent == len(rows) and reports[0].inline is None, (result, len(rows))
            costs["stage"].rows += len(rows)
            costs["dispatch"].rows += len(rows)
            batch_id += 1
            inline_way(rows, SEND_PHASES[2:])
            if forwarded:  # what a received message's columns carry: its id, type and headers
                for row in rows:
                    headers = json.loads(nsb_headers())
                    row.update(message_id=headers["NServiceBus.MessageId"],
                               message_type=headers["NServiceBus.EnclosedMessageTypes"], headers=headers)
                inline_way(rows, FORWARDED)
    finally:
        dispatcher.close()


def spark_floor(spark: Any, per_trigger: int, size: int, cost: Cost, *, batches: int = 4) -> None:
    """Spark's own cost of a micro-batch of our schema, without a database: a Python stream source
    whose tasks yield prebuilt record batches (`rows_batch` of 5,000 rows with NServiceBus's headers,
    built once per task) to a noop sink, 2 tasks per batch as the connector plans on local[2]. Steady
    state: the mean trigger time of the batches after the first."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from spark_qtransport.spark.schema import SCHEMA

    per_task, slices = 5_000, 2
    headers = nsb_headers()  # one NServiceBus header set for every row

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
            import os as _os
            import uuid as _uuid

            import pyarrow as pa

            from spark_qtransport.transport.receiving.decode import ARROW_SCHEMA, rows_batch

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
    fresh(url, n, size, QUEUE)
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
        fresh(url, args.messages, args.size, QUEUE, FLOOR, FLOOR_IN)
        got = receive(url, meter, args.per_trigger, costs, args.claim_mode)
        assert got == args.messages, (got, args.messages)
        got = floor(url, meter, args.per_trigger, costs["floor"])
        assert got == args.messages, (got, args.messages)
        floor_q2q(url, meter, args.messages, args.per_trigger, costs["floor q->q new messages"])
        send(url, meter, args.messages, args.size, args.per_trigger, costs, forwarded=args.forwarded)
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


def total(med: dict[str, Cost], phases: list[str]) -> Cost:
    return Cost(*(sum(getattr(med[p], a) for p in phases) for a in ("wall", "client", "pg", "wal")))


def _line(c: Cost) -> str:
    return f"{c.wall:.2f} s wall, {c.client:.2f} s client CPU, {c.pg:.2f} s PostgreSQL CPU, {c.wal / MB:.1f} MB WAL"


def _ratio(a: Cost, b: Cost) -> str:
    return (f"{a.wall / b.wall:.2f}x wall, {a.pg / b.pg:.2f}x PostgreSQL CPU, {(a.client + a.pg) / (b.client + b.pg):.2f}x"
            f" CPU (client + PostgreSQL), {a.wal / b.wal:.2f}x WAL")


def ratios(med: dict[str, Cost]) -> None:
    """claim + read + ack against the floor; each way of sending against the COPY part of the
    queue -> queue floor (that floor less the receive floor: the same DELETEs and commits)."""
    receive, fl = total(med, ["claim", "read", "ack"]), med["floor"]
    print(f"\nclaim + read + ack: {_line(receive)}\nfloor: {_line(fl)}\nratio: {_ratio(receive, fl)}")
    copy = Cost(*(getattr(med["floor q->q new messages"], a) - getattr(fl, a) for a in ("wall", "client", "pg", "wal")))
    print(f"\nthe floor's send, new messages (floor q->q new messages - floor: headers + COPY): {_line(copy)}")
    ways = {"staged (stage + dispatch)": SEND_PHASES[:2], "inline (task + to driver + dispatch)": SEND_PHASES[2:]}
    if med[FORWARDED[0]].wall:
        ways["inline, forwarded headers"] = FORWARDED
    for way, phases in ways.items():
        sent = total(med, phases)
        print(f"{way}: {_line(sent)}\n  ratio to the floor's send: {_ratio(sent, copy)}")


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; the table shows their median")
    ap.add_argument("--skip-spark", action="store_true", help="leave out the Spark rows (its own floor, the drain batch)")
    ap.add_argument("--forwarded", action="store_true", help="also send inline with NServiceBus's headers passed through")
    ap.add_argument("--claim-mode", default="table", choices=["table", "prepared"],
                    help="where the receive holds its claims (claimMode; default table)")
    ap.add_argument("--json", metavar="PATH", help="write every repetition's figures per --per-trigger messages there")
    args = ap.parse_args()
    print(f"package: {Path(spark_qtransport.__file__).parent}")
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
        if args.json:
            Path(args.json).write_text(json.dumps(
                [{p: dataclasses.asdict(rep[p].scaled(args.per_trigger)) for p in PHASES} for rep in reps], indent=1))
        if args.spark is not None:
            args.spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
