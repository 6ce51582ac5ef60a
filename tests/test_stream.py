"""The source in real Spark streaming queries (local[2], real checkpoints) on the embedded PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from backends import Backend, nsb_headers, prepared_slots
from spark_qtransport import ConfigError, unwrap
from spark_qtransport.spark.versions import capabilities

pytestmark = pytest.mark.usefixtures("spark")

#: Spark 4.2+ gives Python sources admission control; on 4.0/4.1 a run's first batch takes all that
#: waits (AvailableNow is that one batch), and a run's last batch is acknowledged at the next start
ADMISSION = capabilities().admission_control


def reader(spark: Any, pg: Backend, queue: str, error: str, **options: str) -> Any:
    r = spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue).option("errorQueue", error)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _json(v: Any) -> Any:
    import json

    return json.loads(v) if isinstance(v, str) else v


class Collect:
    """A foreachBatch sink that remembers every row it was given, per batch id (at-least-once view)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        with self.lock:
            self.batches.append((batch_id, rows))

    @property
    def rows(self) -> list[Any]:
        return [r for _, rows in self.batches for r in rows]

    def ids(self) -> list[str]:
        return [r.message_id for r in self.rows]


def run_available_now(spark: Any, df: Any, checkpoint: str, sink: Collect) -> Any:
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination(180)
    assert not q.isActive
    assert q.exception() is None, q.exception()
    return q


@pytest.fixture
def queues(pg: Backend, names: Any) -> tuple[str, str]:
    return pg.create_queue(names("Sales")), pg.create_queue(names("error"))


@pytest.mark.compat
def test_message_is_available_in_a_stream(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    h = nsb_headers("order-7", **{"NServiceBus.MessageIntent": "Send"})
    nid = pg.send(q, h, b'{"OrderId": 7}', ttbr_ms=3_600_000)
    sink = Collect()
    run_available_now(spark, reader(spark, pg, q, e), checkpoint, sink)
    (row,) = sink.rows
    assert row.message_id == "order-7"
    assert row.native_id == str(nid)
    assert row.headers == h
    assert bytes(row.body) == b'{"OrderId": 7}'
    assert row.expires is not None
    assert row.message_type == h["NServiceBus.EnclosedMessageTypes"]
    assert row.correlation_id == "order-7"
    assert row.reply_to == "Shop.Web@[dbo]"
    assert row.intent == "Send"
    assert row.time_sent.year == 2025
    assert row.queue == f'"public"."{q}"'
    assert row.claim_seq >= 1 and row.source_seq >= 1


@pytest.mark.compat
def test_starting_again_from_the_checkpoint(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"a{i}"), b"x") for i in range(30)])
    first = Collect()
    run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="7"), checkpoint, first)
    assert len(first.batches) == (5 if ADMISSION else 1)  # admission control: 7 per trigger
    pg.send_many(q, [(nsb_headers(f"b{i}"), b"x") for i in range(12)])  # sent while the query is stopped
    second = Collect()
    run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="7"), checkpoint, second)
    assert first.ids() == [f"a{i}" for i in range(30)]
    assert second.ids() == [f"b{i}" for i in range(12)]
    assert pg.count(q) == 0


@pytest.mark.compat
def test_an_available_now_run_leaves_nothing_claimed(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    """Spark commits a batch to the source only when it plans the next one; an AvailableNow run
    asks for the next offset once more after its last batch, finds nothing and acknowledges it."""
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"a{i}"), b"x") for i in range(9)])
    first = Collect()
    run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="4"), checkpoint, first)
    assert first.ids() == [f"a{i}" for i in range(9)]
    # batches of 4, 4, 1: the last one acknowledged too (4.0/4.1: one batch, acknowledged at the next start)
    assert pg.count(f'"{q}.Claims"') == (0 if ADMISSION else 9)
    second = Collect()
    run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="4"), checkpoint, second)
    assert second.rows == []
    assert pg.count(f'"{q}.Claims"') == 0


@pytest.mark.compat
def test_stop_during_a_batch(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    """A batch stopped mid-way is neither delivered nor lost: the restart replays it, complete."""
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(20)])
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow_sink(df: Any, batch_id: int) -> None:
        seen.extend(r.message_id for r in df.collect())
        entered.set()
        release.wait(30)  # the query is stopped while we wait here
        raise RuntimeError("interrupted")

    query = reader(spark, pg, q, e).writeStream.foreachBatch(slow_sink).option("checkpointLocation", checkpoint).start()
    assert entered.wait(120)
    stopper = threading.Thread(target=query.stop)
    stopper.start()
    time.sleep(1.0)  # stop() is waiting on the batch; let the batch end (it fails, being interrupted)
    release.set()
    stopper.join(60)
    assert seen == [f"m{i}" for i in range(20)]
    assert pg.unheld(q) == 0  # claimed, not acknowledged
    if not prepared_slots():  # held in the claim table (else by a prepared transaction)
        assert pg.count(f'"{q}.Claims"') == 20
    again = Collect()
    run_available_now(spark, reader(spark, pg, q, e), checkpoint, again)
    assert again.ids() == [f"m{i}" for i in range(20)]
    assert again.batches[0][0] == 0  # the same batch id: a replay, not a new batch


@pytest.mark.compat
def test_expired_and_poison_messages_in_a_stream(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    pg.send(q, nsb_headers("ok-1"))
    pg.send(q, nsb_headers("late"), ttbr_ms=-1000)
    pg.send(q, "<corrupted headers", b"raw")
    pg.send(q, nsb_headers("ok-2"))
    sink = Collect()
    query = run_available_now(spark, reader(spark, pg, q, e), checkpoint, sink)
    assert sink.ids() == ["ok-1", "ok-2"]
    if not ADMISSION:  # the poison row moves with its batch's acknowledgement: at the next start
        assert pg.count(e) == 0
        run_available_now(spark, reader(spark, pg, q, e), checkpoint, Collect())
        assert pg.rows(e)[0][1:] == ("<corrupted headers", b"raw")
        return  # and Spark 4.0/4.1 do not ask a Python source for a progress report
    assert pg.rows(e)[0][1:] == ("<corrupted headers", b"raw")
    latest = [_json(p["sources"][0]["latestOffset"]) for p in query.recentProgress if p["sources"][0]["latestOffset"]]
    assert latest and latest[-1]["expired"] == 1 and latest[-1]["poison"] == 1
    assert latest[-1]["queue"] == f'"public"."{q}"' and latest[-1]["endpoint"] == q  # progress names its queue


@pytest.mark.compat
def test_nsb_producers_arrive_exactly_once_in_fifo_order(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    producers, per_producer = 3, 400
    sink = Collect()
    query = (
        reader(spark, pg, q, e, maxMessagesPerTrigger="150")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )

    def produce(p: int) -> None:
        conn = pg.connect()
        try:
            for i in range(per_producer):
                pg.send(q, nsb_headers(f"p{p}-{i:05d}"), b"x" * 100, conn=conn)
        finally:
            conn.close()

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    deadline = time.monotonic() + 120
    while len(sink.rows) < producers * per_producer and time.monotonic() < deadline and query.isActive:
        time.sleep(0.2)
    query.stop()
    assert query.exception() is None
    ids = sink.ids()
    assert len(ids) == len(set(ids)) == producers * per_producer
    # FIFO: each producer's messages arrive in the order it sent them
    for p in range(producers):
        mine = [i for i in ids if i.startswith(f"p{p}-")]
        assert mine == sorted(mine)
    # claim order is queue order: within each micro-batch, claim_seq follows the queue's seq
    for _, rows in sink.batches:
        by_claim = sorted(rows, key=lambda r: r.claim_seq)
        assert [r.source_seq for r in by_claim] == sorted(r.source_seq for r in rows)


@contextlib.contextmanager
def _no_autovacuum(c: Any) -> Any:
    """The server's own background work out of the measurement: an auto-analyze of another test's
    table takes a transaction id too. Needs a superuser (the embedded server); else measured as is."""
    try:
        c.execute("ALTER SYSTEM SET autovacuum = off")
        c.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)  # workers already running finish their table first
    except Exception:  # noqa: BLE001 - not a superuser: measure with autovacuum on
        yield
        return
    try:
        yield
    finally:
        c.execute("ALTER SYSTEM RESET autovacuum")
        c.execute("SELECT pg_reload_conf()")


def test_an_idle_stream_writes_nothing(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    sink = Collect()
    query = (
        reader(spark, pg, q, e).writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
        .trigger(processingTime="50 milliseconds").start()
    )
    try:
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)
        with pg.connect() as c, _no_autovacuum(c):
            before = c.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()[0]
            n = len(query.recentProgress)
            while len(query.recentProgress) < n + 10 and time.monotonic() < deadline:
                time.sleep(0.1)
            after = c.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()[0]
        assert len(query.recentProgress) >= n + 10  # ten idle triggers happened
        assert after == before  # and none of them assigned a transaction id
    finally:
        query.stop()
    assert sink.rows == []


def test_bad_options_fail_at_load(spark: Any, pg: Backend) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="option 'queue' is required"):
        spark.readStream.format("sqlqueue").option("url", pg.url).load()
    with pytest.raises(PySparkException, match="unknown option.*'maxmessages'"):
        spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", "Q").option("maxMessages", "5").load()
    bad = "postgresql://u:hunter2-secret@127.0.0.1:notaport/db"
    with pytest.raises(PySparkException) as info:
        spark.readStream.format("sqlqueue").option("url", bad).option("queue", "Q").load()
    err = unwrap(info.value)
    assert isinstance(err, ConfigError) and err.option == "url", info.value
    assert "hunter2" not in str(info.value)


def test_missing_queue_fails_the_query_with_a_clear_error(spark: Any, pg: Backend, names: Any, checkpoint: str) -> None:
    e = pg.create_queue(names("error"))
    df = reader(spark, pg, names("Absent"), e)
    query = df.writeStream.foreachBatch(Collect()).option("checkpointLocation", checkpoint).start()
    with pytest.raises(Exception, match="does not exist"):
        query.awaitTermination(120)
    assert query.exception() is not None
    assert "option 'queue'" in str(query.exception()) and "does not exist" in str(query.exception())


def test_two_queries_and_an_nsb_endpoint_compete_without_sharing(spark: Any, pg: Backend, queues: tuple[str, str], tmp_path: Any) -> None:
    """Two streaming queries (different endpoints) and NServiceBus's receive SQL drain one queue."""
    import json

    q, e = queues
    total, sent = 1500, 0

    def send(n: int) -> None:
        nonlocal sent
        pg.send_many(q, [(nsb_headers(f"m{i:05d}"), b"x") for i in range(sent, sent + n)])
        sent += n

    sinks = {"A": Collect(), "B": Collect()}
    queries = []
    nsb: list[str] = []
    conn = pg.connect(autocommit=False)
    try:
        # One after the other, each once the previous one has its first rows: on a loaded
        # machine a query's first batch takes seconds, and the others could drain it all first.
        # On Spark 4.0/4.1 a run's first batch takes all that waits: there each query starts on
        # 50 messages, and the rest follow once both run.
        if ADMISSION:
            send(total)
        for name, sink in sinks.items():
            if not ADMISSION:
                send(50)
            queries.append(
                reader(spark, pg, q, e, endpoint=name, maxMessagesPerTrigger="50")
                .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / name))
                .trigger(processingTime="50 milliseconds").start()
            )
            started = time.monotonic() + 120
            while not sink.rows and time.monotonic() < started:
                time.sleep(0.05)
        send(total - sent)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            row = pg.receive_one(q, conn)
            conn.commit()
            if row is not None:
                nsb.append(json.loads(row[2])["NServiceBus.MessageId"])
                time.sleep(0.002)  # a handler that takes a moment
            elif len(nsb) + sum(len(s.rows) for s in sinks.values()) >= total:
                break
            else:
                time.sleep(0.05)
    finally:
        conn.close()
        for query in queries:
            query.stop()
    everything = nsb + sinks["A"].ids() + sinks["B"].ids()
    assert len(everything) == len(set(everything)) == total
    assert sinks["A"].rows and sinks["B"].rows and nsb  # all three really competed
    assert pg.unheld(q) == 0  # (a stopped stream's last batch may still be held by a prepared claim)


def test_password_never_shows_in_plans_or_progress(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    q, e = queues
    pg.send(q, nsb_headers("x"))
    url = pg.url.replace("postgres@", "postgres:TopSecretPw@")  # the embedded server trusts any password
    df = spark.readStream.format("sqlqueue").option("url", url).option("queue", q).option("errorQueue", e).load()
    query = run_available_now(spark, df, checkpoint, Collect())
    texts = [df._jdf.queryExecution().toString(), query._jsq.explainInternal(True), str(query.recentProgress)]
    for text in texts:
        assert "TopSecretPw" not in text


def test_available_now_finishes_while_producers_keep_sending(spark: Any, pg: Backend, queues: tuple[str, str], checkpoint: str) -> None:
    """Trigger.AvailableNow takes what was there when it started and stops, whatever arrives later."""
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"before-{i:04d}"), b"x") for i in range(600)])
    stop = threading.Event()

    def produce() -> None:
        conn = pg.connect()
        try:
            i = 0
            while not stop.is_set():
                pg.send(q, nsb_headers(f"after-{i:05d}"), b"x", conn=conn)
                i += 1
                time.sleep(0.002)  # a steady producer, not a tight loop starving foreachBatch of the GIL
        finally:
            conn.close()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        time.sleep(0.2)
        sink = Collect()
        query = run_available_now(spark, reader(spark, pg, q, e, maxMessagesPerTrigger="100"), checkpoint, sink)
    finally:
        stop.set()
        producer.join(30)
    ids = sink.ids()
    assert len(ids) == len(set(ids))
    assert [i for i in ids if i.startswith("before-")] == [f"before-{i:04d}" for i in range(600)]
    assert len(query.recentProgress) < 40, [p["numInputRows"] for p in query.recentProgress]


def test_a_batch_read_says_to_use_a_stream(spark: Any, pg: Backend) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="receives as a stream only"):
        spark.read.format("sqlqueue").option("url", pg.url).option("queue", "Q").load().collect()
