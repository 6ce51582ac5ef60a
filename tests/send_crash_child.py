"""A queue -> Spark -> queue job that test_crash_send.py starts in its own process and kills.

Each received message ``m`` becomes one message ``m-out`` sent to OUT through
``writeStream.format("sqlqueue")`` (stage on executors, dispatch on the driver). With
SQLQUEUE_CHILD_FAIL_EVERY=N, a message whose id ends in a multiple of N is rejected with fail()
instead (to ERROR, through the same sink); SQLQUEUE_CHILD_AUDIT_QUEUE is the reader's auditQueue. The test makes
the job stall at the moment it wants (database triggers on our tables) and SIGKILLs it there.

Usage: send_crash_child.py URL QUEUE OUT ERROR CHECKPOINT MARKER_DIR [available-now]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from processes import child_spark


def main() -> None:
    url, queue, out, error, checkpoint, marker_dir = sys.argv[1:7]
    available_now = len(sys.argv) > 7 and sys.argv[7] == "available-now"

    from pyspark.sql import functions as F

    from spark_qtransport import fail

    spark = child_spark()
    received = (
        spark.readStream.format("sqlqueue").option("url", url).option("queue", queue).option("errorQueue", error)
        .option("maxMessagesPerTrigger", os.environ.get("SQLQUEUE_CHILD_MAX_MESSAGES", "300"))
        .options(**({"auditQueue": os.environ["SQLQUEUE_CHILD_AUDIT_QUEUE"]} if os.environ.get("SQLQUEUE_CHILD_AUDIT_QUEUE") else {}))
        .load()
    )
    fail_every = int(os.environ.get("SQLQUEUE_CHILD_FAIL_EVERY", "0"))
    rejected = F.regexp_extract("message_id", r"(\d+)$", 1).cast("long") % max(fail_every, 1) == 0
    messages = (received.where(~rejected) if fail_every else received).select(
        F.col("body"),
        F.concat(F.col("message_id"), F.lit("-out")).alias("message_id"),
        F.lit("Crash.Messages.Out").alias("message_type"),
    )
    if fail_every:
        messages = messages.unionByName(received.where(rejected).select(*fail(reason="rejected by the test")),
                                        allowMissingColumns=True)

    def progress(batch_id: int) -> None:
        (Path(marker_dir) / f"batch-{batch_id}").touch()

    writer = (messages.writeStream.format("sqlqueue").option("url", url).option("endpoint", queue)
              .option("destination", out).option("errorQueue", error).option("checkpointLocation", checkpoint)
              .option("inlineBytes", os.environ.get("SQLQUEUE_CHILD_INLINE_BYTES", str(256 * 2**20))))
    query = writer.trigger(availableNow=True).start() if available_now else writer.trigger(
        processingTime="200 milliseconds").start()
    while query.isActive:
        if query.lastProgress:
            progress(query.lastProgress["batchId"])
        query.awaitTermination(0.2)
    query.awaitTermination()


if __name__ == "__main__":
    main()
