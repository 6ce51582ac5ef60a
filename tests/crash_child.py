"""A streaming job that test_crash.py starts in its own process and kills with SIGKILL.

queue -> Spark -> a PostgreSQL table keyed by message id (an idempotent sink), plus a log table
with one row per delivery (so duplicates before the sink's key are visible). The environment
variable CRASH_POINT makes the job stop dead at one point, after touching a marker file:

- ``during_read``: a Python UDF sleeps while the executor reads the batch's claims (a message whose
  id starts with ``warm`` passes, so a test can run a first batch that starts the Python workers);
- ``after_sink``: the batch's rows are committed to the sink, the checkpoint's commit is not.

(``during_claim`` and ``during_ack`` need no help from here: the test makes the claim, or the
audit copies of an acknowledgement, block on a database trigger and kills the job while it waits.)
CRASH_AUDIT_QUEUE, when set, is the reader's ``auditQueue``; CRASH_CLAIM_MODE and CRASH_PREPARED_TIMEOUT its ``claimMode`` and
``preparedClaimTimeout``; CRASH_QUEUE_PATTERN, when set, is its
``queuePattern`` (QUEUE is then ignored).

Usage: crash_child.py URL QUEUE ERROR CHECKPOINT SINK_TABLE MARKER_DIR [available-now]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from processes import child_spark


def main() -> None:
    url, queue, error, checkpoint, sink_table, marker_dir = sys.argv[1:7]
    available_now = len(sys.argv) > 7 and sys.argv[7] == "available-now"
    point = os.environ.get("CRASH_POINT", "")
    markers = Path(marker_dir)

    import psycopg
    from pyspark.sql import functions as F

    spark = child_spark()

    @F.udf("string")
    def passthrough(message_id: str) -> str:
        if point == "during_read" and not message_id.startswith("warm"):
            (markers / "during_read").touch()
            time.sleep(600)
        return message_id

    df = (
        spark.readStream.format("sqlqueue")
        .option("url", url)
        .options(**({"queuePattern": os.environ["CRASH_QUEUE_PATTERN"]} if os.environ.get("CRASH_QUEUE_PATTERN")
                    else {"queue": queue}))
        .option("errorQueue", error)
        .option("maxMessagesPerTrigger", "400")
        .option("claimMode", os.environ.get("CRASH_CLAIM_MODE", "auto"))
        .option("preparedClaimTimeout", os.environ.get("CRASH_PREPARED_TIMEOUT", "60s"))
        .options(**({"auditQueue": os.environ["CRASH_AUDIT_QUEUE"]} if os.environ.get("CRASH_AUDIT_QUEUE") else {}))
        .load()
        .select(passthrough("message_id").alias("message_id"), "native_id", "claim_seq")
    )
    sink_sql = f'INSERT INTO "{sink_table}" (message_id, batch_id) VALUES (%s, %s) ON CONFLICT (message_id) DO NOTHING'
    log_sql = f'INSERT INTO "{sink_table}_log" (message_id, batch_id) VALUES (%s, %s)'

    def write(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = [(r.message_id, batch_id) for r in batch.collect()]
        with psycopg.connect(url) as conn:  # one transaction: idempotent thanks to the key
            with conn.cursor() as cur:
                cur.executemany(sink_sql, rows)
                cur.executemany(log_sql, rows)
        (markers / f"batch-{batch_id}").touch()
        if point == "after_sink" and rows:
            (markers / "after_sink").touch()
            time.sleep(600)

    writer = df.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
    if available_now:
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="200 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    main()
