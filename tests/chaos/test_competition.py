"""Competition: two streaming queries (different endpoints) and a raw NServiceBus consumer drain one
queue while an NServiceBus producer keeps writing to it. No message is received twice, none is lost.

``make test`` runs it for 15 s of production; ``make chaos`` for longer
(SQLQUEUE_CHAOS_COMPETE_SECONDS) and writes a report section with the rates per consumer.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from backends import Backend, nsb_headers
from report import Sampler, plot, section, table
from workload import Producer

pytestmark = [pytest.mark.slow(reason="queries and an NServiceBus consumer compete for a while under a producer"), pytest.mark.usefixtures("spark"), pytest.mark.timeout(1800)]


class Received:
    """Message ids one consumer got, in order (thread-safe)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def add(self, ids: list[str]) -> None:
        with self.lock:
            self.ids.extend(ids)

    def __len__(self) -> int:
        return len(self.ids)


class NsbConsumer(threading.Thread):
    """NServiceBus's receive SQL, one message a transaction, with a handler that takes a moment."""

    def __init__(self, pg: Backend, queue: str) -> None:
        super().__init__(daemon=True)
        self.pg, self.queue, self.got, self.halt = pg, queue, Received(), threading.Event()

    def run(self) -> None:
        conn = self.pg.connect(autocommit=False)
        try:
            while not self.halt.is_set():
                row = self.pg.receive_one(self.queue, conn)
                conn.commit()
                if row is None:
                    self.halt.wait(0.05)
                    continue
                self.got.add([json.loads(row[2])["NServiceBus.MessageId"]])
                time.sleep(0.002)
        finally:
            conn.close()


def test_two_queries_and_an_nsb_consumer_compete_under_a_producer(spark: Any, pg: Backend, names: Any, tmp_path: Any) -> None:
    seconds = float(os.environ.get("SQLQUEUE_CHAOS_COMPETE_SECONDS", "15"))
    q, e = pg.create_queue(names("Compete")), pg.create_queue(names("error"))
    backlog = [f"b{i:05d}" for i in range(2000)]
    pg.send_many(q, [(nsb_headers(m), b"x") for m in backlog])
    producer = Producer(pg, q, pause=0.5)  # slow while the queries start (a few thousand, however slow)
    nsb = NsbConsumer(pg, q)
    got = {"A": Received(), "B": Received()}
    sampler = Sampler(lambda: {"produced": producer.sent, "A": len(got["A"]), "B": len(got["B"]), "NSB": len(nsb.got)})
    queries = []
    try:
        nsb.start()
        # the producer from the start: a query that starts after the others drained the backlog (a
        # busy machine starts a query slowly) still finds messages to compete for
        producer.start()
        for name, received in got.items():
            def collect(df: Any, batch_id: int, received: Received = received) -> None:
                received.add([r.message_id for r in df.select("message_id").collect()])

            queries.append(
                spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", q).option("errorQueue", e)
                .option("endpoint", name).option("maxMessagesPerTrigger", "100").load()
                .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / name))
                .trigger(processingTime="100 milliseconds").start()
            )
            # each query has its first rows before the next starts
            deadline = time.monotonic() + 120
            while not len(received) and time.monotonic() < deadline:
                time.sleep(0.05)
        # then at the chaos pace while all three compete (`make chaos`: 50 messages every 0.05 s; `make
        # test`: every 0.2 s, which a slow machine's consumers still drain within the deadline)
        producer.pause = float(os.environ.get("SQLQUEUE_CHAOS_PAUSE", "0.2"))
        sampler.start()
        time.sleep(seconds)
        producer.stop()
        expected = set(backlog) | set(producer.ids())
        deadline = time.monotonic() + 300
        while sum(map(len, [nsb.got, *got.values()])) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # anything received twice would arrive now
    finally:
        producer.stop()
        nsb.halt.set()
        nsb.join(30)
        for query in queries:
            query.stop()
        samples = sampler.stop()
    everything = nsb.got.ids + got["A"].ids + got["B"].ids
    duplicated = len(everything) - len(set(everything))
    lost = len(expected - set(everything))
    png = plot("competition", samples, totals={"produced": "produced", "A": "query A", "B": "query B", "NSB": "NServiceBus consumer"},
               levels={}, title="two queries and an NServiceBus consumer on one queue")
    section("competition", [
        "## Competition",
        "",
        "Two streaming queries (endpoints A and B, 100 a batch) and NServiceBus's receive SQL (one a",
        f"transaction) drain one queue: a backlog of {len(backlog):,} and an NServiceBus producer, from the queries'",
        f"start until {seconds:.0f} s after each had its first messages.",
        "",
        *table([
            ("messages produced", f"{len(expected):,}"),
            ("received by query A", f"{len(got['A']):,}"),
            ("received by query B", f"{len(got['B']):,}"),
            ("received by the NServiceBus consumer", f"{len(nsb.got):,}"),
            ("received twice", duplicated),
            ("lost", lost),
        ]),
        "",
        *([f"![rates per consumer]({png})", ""] if png else []),
    ], {"produced": len(expected), "A": len(got["A"]), "B": len(got["B"]), "NSB": len(nsb.got),
        "duplicated": duplicated, "lost": lost})
    for name, query in zip(got, queries, strict=False):
        assert query.exception() is None, f"query {name} failed: {query.exception()}"
    assert duplicated == 0, "no message was received twice"
    assert lost == 0, "every message was received"
    counts = {"A": len(got["A"]), "B": len(got["B"]), "NServiceBus": len(nsb.got)}
    assert all(counts.values()), f"all three really competed: {counts}"
    assert pg.unheld(q) == 0  # (with prepared claims, the stopped queries' last batches are still held)
