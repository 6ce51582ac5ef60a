"""What the running Spark line does with the connector, as one row of a table: the same small run on
every line (issue: "Every Spark a Databricks user runs"). 500 NServiceBus-style messages on a queue
made by NServiceBus's DDL, maxMessagesPerTrigger 100:

- Trigger.AvailableNow: its batches and rows; a second run with nothing new;
- a processingTime stream: every message once, its batches;
- queue -> writeStream.format("sqlqueue") and queue -> foreachBatch(QueueSink): messages out;
- claims left after each run and after a restart with nothing new.

Run it with the python of the line's virtualenv (tests/compat/run.py makes them):

    .venv-spark4.0/bin/python bench/versions.py     # one row; --json FILE to keep it
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database, fill, nsb_queue  # noqa: E402

N, PER_TRIGGER = 500, 100


def count(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return int(c.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])  # type: ignore[index]


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the row to this file too")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_qtransport import QueueSink, register
    from spark_qtransport.spark.versions import capabilities

    caps = capabilities()
    work = Path(tempfile.mkdtemp(prefix="sqlqueue-versions-"))
    row: dict[str, Any] = {"pyspark": caps.version, "admission control": caps.admission_control,
                           "Arrow reads": caps.arrow_reads, "Arrow writes": caps.arrow_writes}
    with database(argparse.Namespace(messages=N, size=64, per_trigger=PER_TRIGGER)) as url:
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        nsb_queue(url, "Sales", "Billing", "Invoices", "error")

        def source(queue: str, endpoint: str) -> Any:
            return (spark.readStream.format("sqlqueue").option("url", url).option("queue", queue)
                    .option("endpoint", endpoint).option("errorQueue", "error")
                    .option("maxMessagesPerTrigger", str(PER_TRIGGER)).load())

        batches: list[int] = []

        def collect(df: Any, batch_id: int) -> None:
            batches.append(df.count())

        def available_now(queue: str, endpoint: str, ckpt: str) -> list[int]:
            batches.clear()
            q = (source(queue, endpoint).writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(work / ckpt)).trigger(availableNow=True).start())
            q.awaitTermination(300)
            return [b for b in batches if b]

        # Trigger.AvailableNow, then again with nothing new
        fill(url, "Sales", N, 64, nsb=True)
        t0 = time.monotonic()
        first = available_now("Sales", "Drain", "drain")
        row["AvailableNow"] = f"{len(first)} batches, {sum(first)} rows in {time.monotonic() - t0:.1f} s"
        row["claimed after the run"] = count(url, "Sales.Claims")
        again = available_now("Sales", "Drain", "drain")
        row["after a second run with nothing new"] = f"{sum(again)} rows, {count(url, 'Sales.Claims')} claimed"

        # processingTime: every message once
        fill(url, "Sales", N, 64, nsb=True)
        batches.clear()
        q = (source("Sales", "Stream").writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(work / "stream")).trigger(processingTime="200 milliseconds").start())
        deadline = time.monotonic() + 300
        while sum(batches) < N and time.monotonic() < deadline and q.exception() is None:
            time.sleep(0.2)
        time.sleep(1.0)
        q.stop()
        row["processingTime"] = f"{len([b for b in batches if b])} batches, {sum(batches)} rows"
        row["claimed after the stop"] = count(url, "Sales.Claims")
        restart = (source("Sales", "Stream").writeStream.foreachBatch(collect)
                   .option("checkpointLocation", str(work / "stream")).trigger(processingTime="200 milliseconds").start())
        time.sleep(8)
        restart.stop()
        row["claimed after a restart with nothing new"] = count(url, "Sales.Claims")

        # the two sinks
        def out(df: Any) -> Any:
            return df.select("body", F.lit("Billing.Messages.Invoice").alias("message_type"))

        fill(url, "Sales", N, 64, nsb=True)
        w = (out(source("Sales", "Writer")).writeStream.format("sqlqueue").option("url", url)
             .option("endpoint", "Writer").option("destination", "Billing")
             .option("checkpointLocation", str(work / "writer")).trigger(availableNow=True).start())
        w.awaitTermination(300)
        fill(url, "Sales", N, 64, nsb=True)
        sink = QueueSink(url=url, endpoint="Sinker", destination="Invoices")
        s = (out(source("Sales", "Sinker")).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(work / "sink")).trigger(availableNow=True).start())
        s.awaitTermination(300)
        row["sink, QueueSink"] = f"{count(url, 'Billing')} / {count(url, 'Invoices')}"
        spark.stop()
    print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
