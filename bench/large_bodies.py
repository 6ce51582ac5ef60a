"""Large bodies: peak resident-memory growth of every process while big messages pass queue -> Spark -> queue.

Sends --count messages of --mb MB into a queue, runs one Trigger.AvailableNow stream that receives
them and sends each on (writeStream.format("sqlqueue"), through the outbox), and samples the RSS of
the JVM and of every Python process Spark started, every 20 ms. Prints each process's growth over
its size before the stream started (a Python worker started later grows from its first sample).

    python bench/large_bodies.py [--count 8] [--mb 20] [--driver-memory 1g] [--java-options "-XX:+UseSerialGC"]

The Python processes are the connector's (its reads, its staging); the JVM's growth is Spark's own
copies of each row between the reader's and the writer's Arrow streams, bounded by its heap.
Uses $SQLQUEUE_URL if set, else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import database  # noqa: E402

MB = 2**20


class Peaks:
    """Peak RSS of this process's descendants, sampled in a thread."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.base: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.name: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peaks:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def _sample(self) -> None:
        for p in self._psutil.Process().children(recursive=True):
            try:
                rss = p.memory_info().rss
                if p.pid not in self.name:
                    cmd = p.cmdline()
                    self.name[p.pid] = "jvm" if p.name() == "java" else (cmd[-1] if cmd else p.name())
            except self._psutil.Error:
                continue
            self.base.setdefault(p.pid, rss)
            self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)

    def lines(self) -> list[str]:
        rows = sorted(self.peak, key=lambda pid: self.peak[pid] - self.base[pid], reverse=True)
        return [f"  {self.name[pid][-40:]:40} {self.base[pid] / MB:7.0f} MB -> {self.peak[pid] / MB:7.0f} MB "
                f"({(self.peak[pid] - self.base[pid]) / MB:+.0f} MB)"
                for pid in rows if self.peak[pid] - self.base[pid] >= 4 * MB or self.name[pid] == "jvm"]


def fill(url: str, queue: str, count: int, size: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        for i in range(count):
            headers = json.dumps({"NServiceBus.MessageId": f"{queue}-{i}", "NServiceBus.ContentType": "application/json",
                                  "NServiceBus.EnclosedMessageTypes": "Bench.Large"})
            c.execute(f'INSERT INTO "{queue}" (id, headers, body) VALUES (%s, %s, %s)',
                      (uuid.uuid4(), headers, os.urandom(size)))


def run(spark, url: str, source: str, target: str, checkpoint: str) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    received = (spark.readStream.format("sqlqueue").option("url", url).option("queue", source)
                .option("errorQueue", "BenchLargeError").load())
    query = (received.select("body", "message_id", "message_type", F.lit(target).alias("destination"))
             .writeStream.format("sqlqueue").option("url", url).option("endpoint", source)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--mb", type=int, default=20, help="body size in MB (default 20)")
    ap.add_argument("--driver-memory", default="1g", help="spark.driver.memory (the local JVM's heap)")
    ap.add_argument("--java-options", default="", help="added to spark.driver.extraJavaOptions")
    ap.add_argument("--max-bytes-per-batch", default=str(16 * MB),
                    help="spark.sql.execution.arrow.maxBytesPerBatch (Spark's default is 64 MB)")
    args = ap.parse_args()
    args.messages, args.size, args.per_trigger = args.count, args.mb * MB, 1000
    with database(args) as url:
        from _spark import read_conf, session

        from spark_qtransport.connections import parse_url
        from spark_qtransport.transport import create_queues

        java = f"{read_conf().get('spark.driver.extraJavaOptions', '')} {args.java_options}".strip()
        spark = session("sqlqueue-large-bodies", {
            "spark.driver.memory": args.driver_memory, "spark.driver.extraJavaOptions": java,
            "spark.sql.execution.arrow.maxBytesPerBatch": args.max_bytes_per_batch})
        tmp = tempfile.mkdtemp(prefix="sqlqueue-large-")
        try:
            queues = ("BenchLargeWarmIn", "BenchLargeWarmOut", "BenchLargeIn", "BenchLargeOut", "BenchLargeError")
            create_queues(parse_url(url), *queues)
            fill(url, "BenchLargeWarmIn", args.count, 100)  # Spark starts its Python workers here
            run(spark, url, "BenchLargeWarmIn", "BenchLargeWarmOut", f"{tmp}/warm")
            fill(url, "BenchLargeIn", args.count, args.size)
            started = time.perf_counter()
            with Peaks() as peaks:
                run(spark, url, "BenchLargeIn", "BenchLargeOut", f"{tmp}/big")
            took = time.perf_counter() - started
        finally:
            spark.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"{args.count} x {args.mb} MB queue -> Spark -> queue in {took:.1f} s; driver memory "
              f"{args.driver_memory}, java options {args.java_options or '(none)'}, maxBytesPerBatch "
              f"{int(args.max_bytes_per_batch) // MB} MB; peak RSS growth per process:")
        print("\n".join(peaks.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
