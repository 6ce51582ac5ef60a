"""Memory is bounded by bytes, not only by rows: large bodies through queue -> Spark -> queue.

Eight 20 MB messages are received and sent on by one stream while a thread samples the resident
memory of every process the test started (the JVM, Spark's Python workers, the source's and the
sink's driver-side Python processes). No Python process may grow by more than 200 MB; the JVM's
growth is printed, not checked (its heap, see the end of the test).
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import psutil
import pytest

from backends import Backend, nsb_headers
from spark_qtransport.wire import H, decode_headers

MB = 2**20
BODY = 20 * MB
COUNT = 8
LIMIT = 200 * MB
MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"


class RssSampler:
    """Peak resident memory of the test process's descendants, sampled in a thread.

    A process that exists when sampling starts grows from its size then; one started later grows
    from its first sample (a forked Python worker starts at its parent's size).
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.base: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.label: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for p in psutil.Process().children(recursive=True):
            try:
                rss = p.memory_info().rss
                if p.pid not in self.label:
                    self.label[p.pid] = _label(p)
            except psutil.Error:
                continue
            self.base.setdefault(p.pid, rss)
            self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)

    def growth(self) -> dict[str, int]:
        return {f"{self.label[pid]} {pid}": self.peak[pid] - self.base[pid] for pid in self.peak}

    def report(self) -> str:
        return ", ".join(f"{k}: {v / MB:+.0f} MB (peak {self.peak[int(k.rsplit(' ', 1)[1])] / MB:.0f} MB)"
                         for k, v in sorted(self.growth().items()) if v >= MB or k.startswith("jvm"))


def _label(p: psutil.Process) -> str:
    """jvm, python (a worker: its pyspark module, `task` for the source's reads and the sink's
    writes), or the program's name."""
    cmd = p.cmdline()
    if p.name() == "java":
        return "jvm"
    if not cmd or "python" not in cmd[0]:
        return p.name()
    module = cmd[-1].rsplit(".", 1)[-1]
    return "python " + ("task" if module == "worker" else module)


def _pipeline(spark: Any, pg: Backend, source: str, target: str, error: str, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    received = (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", source)
                .option("errorQueue", error).load())
    out = received.select("body", "message_id", "message_type", F.lit(target).alias("destination"))
    return (out.writeStream.format("sqlqueue").option("url", pg.url).option("endpoint", source)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def _finish(query: Any) -> None:
    query.awaitTermination(600)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


def _digests(pg: Backend, queue: str) -> dict[str, list[str]]:
    """Receive everything with NServiceBus's receive SQL: message id -> body digests."""
    out: dict[str, list[str]] = {}
    with pg.connect(autocommit=False) as conn:
        while (row := pg.receive_one(queue, conn)) is not None:
            conn.commit()
            headers = decode_headers(row[2])
            assert headers is not None
            out.setdefault(headers[H.MESSAGE_ID], []).append(hashlib.sha256(bytes(row[3])).hexdigest())
    return out


def test_reads_fetch_by_bytes(pg: Backend, names: Any) -> None:
    """Each fetch holds at most the budget's bytes (or a single row), and all rows come, in order."""
    from spark_qtransport.transport.receiving.receiver import Receiver, read_chunks
    from spark_qtransport.transport.settings import ReceiveSettings

    queue, error = pg.create_queue(names("Mixed")), pg.create_queue(names("error"))
    sizes = [3 * MB, 1 * MB, 1 * MB, 1 * MB] + [1000] * 40 + [2 * MB] * 3
    pg.send_many(queue, [(nsb_headers(f"m{i}"), os.urandom(n)) for i, n in enumerate(sizes)])
    r = Receiver(ReceiveSettings.create(pg.url, queue, error_queue=error, claim_ahead=False))
    try:
        start = r.initial_offset()
        (part,) = r.slices(start, r.latest(start, 1000))
        chunks = list(read_chunks(part, budget=2 * MB))
    finally:
        r.close()
    assert [len(bytes(row[4])) for chunk in chunks for row in chunk] == sizes
    assert len(chunks[0]) == 1  # the first fetch asks for one row
    for chunk in chunks:
        assert len(chunk) == 1 or sum(len(row[3]) + len(row[4]) for row in chunk) <= 2 * MB
    assert max(len(c) for c in chunks) == 1  # 3 MB seen first: one row a fetch from then on


def test_small_rows_still_come_5000_a_fetch(pg: Backend, names: Any) -> None:
    from spark_qtransport.transport.receiving.receiver import Receiver, read_chunks
    from spark_qtransport.transport.settings import ReceiveSettings

    queue, error = pg.create_queue(names("Small")), pg.create_queue(names("error"))
    pg.send_many(queue, [(nsb_headers(f"s{i}"), b"x" * 1024) for i in range(12_000)])
    r = Receiver(ReceiveSettings.create(pg.url, queue, error_queue=error, claim_ahead=False, max_messages=20_000))
    try:
        start = r.initial_offset()
        (part,) = r.slices(start, r.latest(start, 20_000))
        fetched = [len(chunk) for chunk in read_chunks(part)]
    finally:
        r.close()
    assert fetched == [1, 4, 16, 64, 256, 1024, 4096, 5000, 1539]


def test_sink_turns_large_record_batches_into_rows_a_slice_at_a_time() -> None:
    import pyarrow as pa

    from spark_qtransport.spark.writer import _rows, _slices

    bodies = [bytes([i]) * (MB if i % 3 else 5 * MB) for i in range(10)]  # 5, 1, 1, 5, 1, 1, ...
    batch = pa.RecordBatch.from_pydict({"body": bodies, "message_id": [f"m{i}" for i in range(10)]})
    parts = list(_slices(batch, 3 * MB))
    assert sum(p.num_rows for p in parts) == 10
    for p in parts:
        assert p.num_rows == 1 or p.nbytes <= 3 * MB + 64 * p.num_rows
    assert [p.num_rows for p in parts] == [1, 2, 1, 2, 1, 2, 1]
    assert list(_slices(batch, 100 * MB)) == [batch]
    rows = [row for part in _rows(iter([batch])) for row in part]
    assert rows == [{"body": b, "message_id": f"m{i}"} for i, b in enumerate(bodies)]


@pytest.mark.slow(reason="streams bodies of several MB through Spark and measures the worker's memory")
@pytest.mark.usefixtures("spark")
def test_large_bodies_pass_through_a_stream_in_bounded_memory(
    spark: Any, pg: Backend, names: Any, checkpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = pg.create_queue(names("error"))
    # a small run first: Spark starts its Python workers, which later batches reuse
    warm_in, warm_out = pg.create_queue(names("WarmIn")), pg.create_queue(names("WarmOut"))
    pg.send_many(warm_in, [(nsb_headers(f"warm-{i}"), b"{}") for i in range(COUNT)])
    _finish(_pipeline(spark, pg, warm_in, warm_out, error, checkpoint + "-warm"))
    assert len(_digests(pg, warm_out)) == COUNT

    source, target = pg.create_queue(names("BigIn")), pg.create_queue(names("BigOut"))
    sent: dict[str, str] = {}
    for i in range(COUNT):
        body = i.to_bytes(4, "big") + os.urandom(BODY - 4)
        sent[f"big-{i}"] = hashlib.sha256(body).hexdigest()
        pg.send(source, nsb_headers(f"big-{i}"), body)
        del body

    # Spark hands the sink's Python worker Arrow batches of up to 64 MB plus a row (its default
    # maxBytesPerBatch) and keeps the previous one while it reads the next: with 20 MB rows that
    # is 170 MB of Spark's own in the worker. Smaller batches, as a job with large bodies sets them:
    spark.conf.set(MAX_BYTES_PER_BATCH, str(16 * MB))
    try:
        with RssSampler() as rss:
            _finish(_pipeline(spark, pg, source, target, error, checkpoint))
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)
    with capsys.disabled():
        print(f"\nRSS growth while {COUNT} x {BODY // MB} MB messages passed: {rss.report()}")

    received = _digests(pg, target)
    assert received == {mid: [digest] for mid, digest in sent.items()}
    assert pg.count(source) == 0
    # the JVM is not held to the limit: its heap grows by 200 to 850 MB here (up to its 1 GB
    # maximum) as Spark copies each row on heap between the two Arrow streams, whatever we do
    python = {k: v for k, v in rss.growth().items() if k.startswith("python")}
    assert any(k.startswith("python task") and v > BODY for k, v in python.items()), rss.report()  # sampled
    assert max(python.values()) < LIMIT, rss.report()
