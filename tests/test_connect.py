"""The sink and the jobs' Delta append over Spark Connect (Databricks serverless and standard
access mode): no ``sparkContext`` on the client or in foreachBatch functions.

One local Spark Connect server (pyspark's own ``SparkConnectServer``, with the jobs' Delta jars)
for the whole test session, in its own process; the tests talk to it with a Connect client
session. Each stream runs with availableNow, is stopped, gets more messages, runs again from its
checkpoint, and has its last batch replayed (its commit deleted): every message arrives once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport import QueueSink, register
from spark_qtransport.wire import H

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"

pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server (with Delta), started once per test session."""
    import pyspark

    sys.path.insert(0, str(JOBS))
    import _spark

    home = Path(pyspark.__file__).parent
    port = _free_port()
    conf = {
        **_spark.with_cached_jars(_spark.delta_conf()),
        "spark.master": "local[2]",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.pollingDelay": "10ms",
        "spark.sql.streaming.noDataProgressEventInterval": "0",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={ROOT / 'conf' / 'log4j2.properties'}",
    }
    args = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    # the server's Python workers: this interpreter (the package is installed in it), and the jobs'
    # and tests' modules (foreachBatch functions are pickled with references to their functions)
    path = [str(JOBS), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited: {log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Spark Connect server did not start: {log.read_text()[-3000:]}") from None
                time.sleep(0.25)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()  # the JVM stops its Python workers on the way out
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="session")
def connect_session(connect_url: str) -> Iterator[Any]:
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession.builder.remote(connect_url).create()
    register(session)
    yield session
    session.stop()


@pytest.fixture
def connect(connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Connect session; pyspark's functions build Connect columns while a test runs (this
    process may also hold the classic test session)."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session


def source(spark: Any, pg: Backend, queue: str, error: str) -> Any:
    return (spark.readStream.format("sqlqueue").option("url", pg.url).option("queue", queue)
            .option("errorQueue", error).option("maxMessagesPerTrigger", "20").load())


def invoices(received: Any) -> Any:
    return received.selectExpr("body", "'Billing.Messages.Invoice' AS message_type",
                               "concat(message_id, '-invoice') AS message_id")


def finish(query: Any, timeout: float = 180) -> None:
    query.awaitTermination(timeout)
    assert not query.isActive, "query did not finish"
    assert query.exception() is None, query.exception()


def across_a_restart_and_a_replay(pg: Backend, queue: str, checkpoint: str, run: Any) -> None:
    """Run, stop, send more, run again, then replay the last batch (its commit deleted)."""
    pg.send_many(queue, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(30)])
    run()
    pg.send_many(queue, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(30, 50)])
    run()
    commits = Path(checkpoint) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink()
    run()
    assert (commits / str(last)).exists(), "the last batch ran again"


@pytest.fixture
def queues(pg: Backend, names: Any) -> Any:
    class Q:
        sales = pg.create_queue(names("Sales"))
        billing = pg.create_queue(names("Billing"))
        error = pg.create_queue(names("error"))

    return Q


EXPECTED = [f"m{i:03d}-invoice" for i in range(50)]


def test_foreach_batch_queue_sink_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, checkpoint: str) -> None:
    q = queues
    sink = QueueSink(url=pg.url, endpoint=q.sales, destination=q.billing)

    def run() -> None:
        finish(invoices(source(connect, pg, q.sales, q.error)).writeStream.foreachBatch(sink)
               .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.billing)) == EXPECTED
    assert pg.count(q.sales) == 0 and pg.count(f'"{q.sales}.Staging"') == 0


def test_stream_writer_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, checkpoint: str) -> None:
    q = queues

    def run() -> None:
        finish(invoices(source(connect, pg, q.sales, q.error)).writeStream.format("sqlqueue")
               .option("url", pg.url).option("endpoint", q.sales).option("destination", q.billing)
               .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    assert sorted(h[H.MESSAGE_ID] for h, _ in pg.drain(q.billing)) == EXPECTED


def test_two_queue_sinks_with_one_name_are_refused_over_connect(connect: Any, pg: Backend, queues: Any, checkpoint: str) -> None:
    q = queues
    first, second = (QueueSink(url=pg.url, endpoint=q.sales, destination=q.billing) for _ in range(2))
    pg.send_many(q.sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])

    def both(batch: Any, batch_id: int) -> None:
        first(invoices(batch), batch_id)
        second(invoices(batch), batch_id)

    with pytest.raises(Exception, match="called twice in batch 0"):
        (source(connect, pg, q.sales, q.error).writeStream.foreachBatch(both)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination(180))


def test_queue_to_delta_append_over_connect_is_exactly_once(connect: Any, pg: Backend, queues: Any, tmp_path: Path) -> None:
    sys.path.insert(0, str(JOBS))
    import queue_to_delta

    q, table, checkpoint = queues, str(tmp_path / "bronze"), str(tmp_path / "ckpt")

    query_ids = set()

    def run() -> None:
        query = (queue_to_delta.bronze(source(connect, pg, q.sales, q.error)).writeStream
                 .foreachBatch(queue_to_delta.append_once(table, "bronze-connect"))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        finish(query)
        query_ids.add(query.id)

    across_a_restart_and_a_replay(pg, q.sales, checkpoint, run)
    rows = connect.read.format("delta").load(table).select("message_id").collect()
    assert sorted(r.message_id for r in rows) == [f"m{i:03d}" for i in range(50)]
    # every append is keyed by the job id and the checkpoint's query id (not a placeholder)
    commits = [json.loads(line) for f in sorted((Path(table) / "_delta_log").glob("*.json"))
               for line in f.read_text().splitlines()]
    assert {c["txn"]["appId"] for c in commits if "txn" in c} == {f"bronze-connect:{i}" for i in query_ids}
    assert len(query_ids) == 1
