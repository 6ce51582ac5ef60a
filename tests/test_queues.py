"""Several queues in one stream (`queue` as a list, `queuePattern`) and Kafka's admission control
(`minMessagesPerTrigger`, `maxTriggerDelay`), in real Spark queries on the embedded PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from test_stream import Collect, run_available_now

from backends import Backend, nsb_headers
from spark_qtransport.dialects import dialect_named
from spark_qtransport.transport.receiving.admission import TriggerGate, fair_shares, taking_turns
from spark_qtransport.transport.selection import QueuePattern, split_queue_list


def produce(pg: Backend, queue: str, start: int, n: int) -> None:
    """Messages `<queue>-000000`, ... in the queue's FIFO order."""
    tag = queue.replace(".", "/")
    pg.send_many(queue, [(nsb_headers(f"{tag}-{start + i:06d}"), b"{}") for i in range(n)])


def fifo_and_once(delivered: list[str], expected: dict[str, int]) -> None:
    """Each message exactly once, and each queue's messages in the order they were sent."""
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    per: dict[str, list[int]] = defaultdict(list)
    for message_id in delivered:
        tag, n = message_id.rsplit("-", 1)
        per[tag].append(int(n))
    assert {t: len(ns) for t, ns in per.items()} == expected
    for tag, ns in per.items():
        assert ns == sorted(ns), f"queue {tag} was not delivered in FIFO order"


# -- pieces ---------------------------------------------------------------------------------------


def test_fair_shares_never_starve_a_small_queue() -> None:
    assert fair_shares({"small": 100, "big": 100_000}, 1000) == {"small": 100, "big": 900}
    assert fair_shares({"a": 5000, "b": 5000, "c": 10}, 1000) == {"c": 10, "a": 495, "b": 495}
    assert fair_shares({"a": 0, "b": 0}, 1000) == {"a": 1, "b": 1}  # an estimate may miss a new message
    shares = fair_shares({f"q{i}": 10**6 for i in range(7)}, 1000)
    assert sum(shares.values()) == 1000 and max(shares.values()) - min(shares.values()) <= 1
    assert sum(fair_shares({f"q{i:02d}": 1 for i in range(20)}, 10).values()) == 20  # at least one each


def test_busy_queues_a_batch_cannot_serve_usefully_take_turns() -> None:
    """1,000 queues of 20 messages and batches of 5,000: 250 queues' 20 a batch, not 1,000 queues' 5;
    the next batch begins after the last queue served, and wraps round; a batch smaller than a turn
    moves on to the next queue each time; a queue that wants less than a turn takes what it wants."""
    assert not taking_turns({f"q{i}": 10**6 for i in range(7)}, 1000)  # 7 x 142: shared as before
    demand = {f"q{i:03d}": 20 for i in range(1000)}
    assert taking_turns(demand, 5000)
    first = fair_shares(demand, 5000)
    assert list(first) == [f"q{i:03d}" for i in range(250)] and set(first.values()) == {20}
    assert list(fair_shares(demand, 5000, after="q249"))[:2] == ["q250", "q251"]
    wrapped = fair_shares(demand, 5000, after="q900")
    assert list(wrapped)[:100] == [f"q{i:03d}" for i in range(901, 1000)] + ["q000"] and len(wrapped) == 250
    big = {"a": 1000, "b": 1000, "c": 1000}
    assert [fair_shares(big, 30, after=k) for k in (None, "a", "b", "c")] == [{"a": 30}, {"b": 30}, {"c": 30}, {"a": 30}]
    assert fair_shares({"a": 1000, "b": 5, "c": 1000}, 150) == {"a": 100, "b": 5, "c": 45}
    assert fair_shares({f"q{i:02d}": 5 for i in range(20)}, 10) == {"q00": 5, "q01": 5}


def test_trigger_gate_waits_for_min_or_delay() -> None:
    now = [0.0]
    gate = TriggerGate(1000, 5.0, clock=lambda: now[0])
    assert gate.admit(lambda: 0)  # the first trigger is never held, as in Kafka
    now[0] = 1.0
    assert not gate.admit(lambda: 999)
    assert gate.admit(lambda: 1000)
    now[0] = 5.9
    assert not gate.admit(lambda: 10)
    now[0] = 6.0  # five seconds after the last batch
    assert gate.admit(lambda: 10)
    assert gate.held == 2


def test_backlogs_of_many_queues_in_one_statement_never_wait_on_a_held_row(pg: Backend, names: Any) -> None:
    """The stream's idle check (`Dialect.backlogs`, `tables_exist`) on a real server: the span of
    each queue, 0 for an empty one; a row another consumer holds (NServiceBus's receive, its
    transaction open) neither blocks the read nor is locked by it."""
    empty, busy, held = (pg.create_queue(names(n), nsb=True) for n in ("empty", "busy", "held"))
    produce(pg, busy, 0, 5)
    produce(pg, held, 0, 2)
    d = pg.dialect
    queues = [pg.address(q) for q in (empty, busy, held)]
    with pg.connect(autocommit=False) as receiver, pg.connect() as c:
        assert pg.receive_one(held, receiver) is not None  # holds the first row, transaction open
        c.execute("SET lock_timeout = '2s'")  # a read that waited would fail here
        rows = dict(c.execute(d.backlogs(queues).sql).fetchall())
        assert rows == {0: 0, 1: 5, 2: 2}
        exists = d.tables_exist([queues[0], pg.address(names("missing")), d.claims_table(queues[1])])
        assert dict(c.execute(exists.sql, exists.params).fetchall()) == {0: 1, 1: 0, 2: 0}
        # the rows it read are not locked: a competing receive takes the other one at once
        with pg.connect(autocommit=False) as other:
            assert pg.receive_one(held, other) is not None
            other.rollback()
        receiver.rollback()


def test_small_slices_of_many_queues_share_a_few_tasks() -> None:
    """300 queues with a few claims each are a handful of Spark tasks, not 300; a queue cut into
    several slices keeps them in separate tasks; large slices stay alone."""
    from spark_qtransport.connections import parse_url
    from spark_qtransport.transport.receiving.receiver import ClaimSlice, pack

    url, d = parse_url("postgresql://h/db"), dialect_named("postgres")

    def part(queue: str, after: int, upto: int) -> ClaimSlice:
        return ClaimSlice(url, "postgres", queue, d.parse_address(queue + ".Claims"), "c", "1", after, upto)

    tenants = [part(f"t{i}", 10, 12) for i in range(300)]
    groups = pack(tenants, 25_000, 16)
    assert 14 <= len(groups) <= 17 and sum(len(g) for g in groups) == 300
    assert [p for g in groups for p in g] == tenants  # order kept: each queue's slices in order
    one = [part("Sales", i * 100, (i + 1) * 100) for i in range(4)]  # numPartitions 4 on one queue
    assert pack(one, 25_000, 16) == [[p] for p in one]
    big = [part("A", 0, 30_000), part("B", 0, 20_000), part("C", 0, 10)]
    assert pack(big, 25_000, 16) == [[big[0]], [big[1]], [big[2]]]


def test_queue_lists_and_patterns_parse() -> None:
    assert split_queue_list('Sales, "x"."a,b" ,[c,d]@[dbo]') == ["Sales", '"x"."a,b"', "[c,d]@[dbo]"]
    pg = dialect_named("postgres")
    p = QueuePattern.parse(pg, '"tenant_*"."audit"')
    assert p.matches(pg, "tenant_7", "audit") and not p.matches(pg, "tenant_7", "Audit")
    assert not p.matches(pg, "public", "audit")
    assert QueuePattern.parse(pg, "Sales*").matches(pg, "public", "Sales.Replies")
    ms = dialect_named("sqlserver")
    assert QueuePattern.parse(ms, "*.Replies").matches(ms, "DBO", "sales.replies")  # as SQL Server compares
    # the catalog query reads only candidates: LIKE patterns wider than the glob, wildcards escaped
    assert p.like(pg) == ("tenant\\_%", "audit")
    assert QueuePattern.parse(pg, "Sales*").like(pg) == ("public", "Sales%")
    assert QueuePattern.parse(pg, '"a%b"."q[12]?"').like(pg) == ("a\\%b", "q__")
    stmt = ms.list_queues(like=QueuePattern.parse(ms, "audit@[t_*]").like(ms))
    assert stmt.params == ("t\\_%", "audit") and "s.name LIKE ? ESCAPE N'\\'" in stmt.sql


# -- streams --------------------------------------------------------------------------------------


def test_three_queues_by_list_in_one_stream(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    big, small, tiny = (pg.create_queue(names(n)) for n in ("Big", "Small", "Tiny"))
    e, audit = pg.create_queue(names("error")), pg.create_queue(names("audit"))
    produce(pg, big, 0, 1200)
    produce(pg, small, 0, 100)
    produce(pg, tiny, 0, 3)
    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", f"{big}, {small},{tiny}")
          .option("errorQueue", e).option("maxMessagesPerTrigger", "500").option("auditQueue", audit).load())
    sink = Collect()
    q = run_available_now(spark, df, checkpoint, sink)
    ordered = [r.message_id for _, rows in sorted(sink.batches, key=lambda b: b[0]) for r in rows]
    fifo_and_once(ordered, {big: 1200, small: 100, tiny: 3})
    first = [r.message_id for r in sorted(sink.batches, key=lambda b: b[0])[0][1]]
    assert sum(m.startswith(small) for m in first) == 100, "the small queue is drained in the first batch"
    assert sum(m.startswith(tiny) for m in first) == 3
    assert all(len(rows) <= 500 for _, rows in sink.batches)
    assert {r.queue for r in sink.rows} == {f'"public"."{n}"' for n in (big, small, tiny)}
    # each queue has its own claim table, all acknowledged by the end of the run
    for n in (big, small, tiny):
        assert pg.count(n) == 0
    progress = json.loads(q.lastProgress["sources"][0]["latestOffset"])
    assert set(progress["queues"]) == {f'"public"."{n}"' for n in (big, small, tiny)}

    # a restart from the checkpoint reads what came since, from every queue
    produce(pg, tiny, 3, 2)
    produce(pg, big, 1200, 1)
    again = Collect()
    run_available_now(spark, df, checkpoint, again)
    assert sorted(again.ids()) == [f"{big}-001200", f"{tiny}-000003", f"{tiny}-000004"]
    # the platform works per queue: one audit copy of each message, naming the queue it came from
    with pg.connect() as c:
        processed = dict(c.execute(
            f"SELECT headers::jsonb ->> 'NServiceBus.ProcessingEndpoint', count(*) FROM \"{audit}\" GROUP BY 1"
        ).fetchall())
    assert processed == {big: 1201, small: 100, tiny: 5}


def test_min_messages_per_trigger_waits_for_a_batch_or_the_delay(spark: Any, pg: Backend, names: Any,
                                                                 checkpoint: str) -> None:
    q, e = pg.create_queue(names("Trickle")), pg.create_queue(names("error"))
    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
          .option("minMessagesPerTrigger", "1000").option("maxTriggerDelay", "5s").load())
    sink = Collect()
    stamps: list[tuple[float, int]] = []

    def collect(batch: Any, batch_id: int) -> None:
        planned = time.monotonic()  # the batch was planned and claimed; its rows are read below
        sink(batch, batch_id)
        stamps.append((planned, len(sink.batches[-1][1])))

    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    stop = threading.Event()
    trickled = [0]

    def trickle() -> None:  # 10 messages a second
        while not stop.is_set():
            produce(pg, q, trickled[0], 1)
            trickled[0] += 1
            time.sleep(0.1)

    try:
        producer = threading.Thread(target=trickle, daemon=True)
        producer.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(1 for _, n in stamps if n) < 3:
            time.sleep(0.2)
        stop.set()
        producer.join()
        trickle_batches = [(t, n) for t, n in stamps if n]
        assert len(trickle_batches) >= 3, stamps
        gaps = [t2 - t1 for (t1, _), (t2, _) in zip(trickle_batches[1:], trickle_batches[2:], strict=False)]
        # never before the delay; the upper bound only says the delay does release them (a loaded machine is slow)
        assert gaps and all(4.0 <= g <= 15.0 for g in gaps), f"batches about every 5 s, not {gaps}"
        assert all(n <= 100 for _, n in trickle_batches[1:])  # a trickle's worth each, not one per message
    finally:
        stop.set()
        query.stop()
    progress = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    assert progress["triggersHeldBack"] > 0


def test_min_messages_per_trigger_admits_a_burst_without_waiting_for_the_delay(spark: Any, pg: Backend, names: Any,
                                                                              checkpoint: str) -> None:
    """A delay of ten minutes holds a few messages back; 5,000 more make a batch at once, well inside the delay,
    so the test proves the admission without timing it closely."""
    q, e = pg.create_queue(names("Burst")), pg.create_queue(names("error"))
    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
          .option("minMessagesPerTrigger", "1000").option("maxTriggerDelay", "10m").load())
    sink = Collect()
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())

    def held_back() -> int:
        last = query.lastProgress
        return json.loads(last["sources"][0]["latestOffset"] or "{}").get("triggersHeldBack", 0) if last else 0

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and query.lastProgress is None:  # a fresh query's first trigger is free
            time.sleep(0.2)
        produce(pg, q, 0, 10)
        while time.monotonic() < deadline and held_back() < 3:  # progress of idle triggers comes every 10 s
            time.sleep(0.2)
        assert held_back() >= 3, "ten messages under minMessagesPerTrigger were not held back"
        assert sink.ids() == []
        produce(pg, q, 10, 5000)
        deadline = time.monotonic() + 120  # far inside the ten minutes: only admission takes the batch
        while time.monotonic() < deadline and len(sink.ids()) < 5010:
            time.sleep(0.2)
    finally:
        query.stop()
    assert sink.ids() == [f"{q}-{i:06d}" for i in range(5010)]
    assert max(len(rows) for _, rows in sink.batches) == 5010, "the burst was not taken in one batch"


def test_min_messages_per_trigger_does_not_hold_an_available_now_run(spark: Any, pg: Backend, names: Any,
                                                                     checkpoint: str) -> None:
    q, e = pg.create_queue(names("Few")), pg.create_queue(names("error"))
    produce(pg, q, 0, 10)
    df = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
          .option("minMessagesPerTrigger", "1000").load())
    sink = Collect()
    run_available_now(spark, df, checkpoint, sink)
    assert len(sink.ids()) == 10


def test_a_checkpoint_cannot_switch_between_one_queue_and_several() -> None:
    from spark_qtransport.errors import OffsetError
    from spark_qtransport.transport.receiving.planner import ClaimOffset
    from spark_qtransport.transport.receiving.queueset import QueueSetOffset

    with pytest.raises(OffsetError, match="several queues"):
        ClaimOffset.from_dict({"queues": {}})
    with pytest.raises(OffsetError) as refused:
        QueueSetOffset.from_dict({"claim": 3, "claimTable": "1"})
    assert "one-queue" in str(refused.value) and '"claim": 3' in str(refused.value)  # which way; the offset refused
    offset = QueueSetOffset({"b": ClaimOffset(2, "9"), "a": ClaimOffset(1, "8")})
    assert list(offset.to_dict()["queues"]) == ["a", "b"]  # stable JSON: Spark compares offsets as text
    assert QueueSetOffset.from_dict(offset.to_dict()) == offset
