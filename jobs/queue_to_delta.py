"""Drain a queue into a Delta "bronze" table, exactly once across restarts.

Each message becomes one row: its NServiceBus headers decoded into columns (message id, type,
correlation id, conversation id, time sent, intent, reply-to), all headers as a map, the body as
binary and, for JSON or text content, as a string, partitioned by the date it was sent. Every
micro-batch is appended with Delta's idempotent writes (``txnAppId`` = job id + the streaming
query's id, ``txnVersion`` = batch id): a batch Spark replays after a crash is not appended twice,
and a new checkpoint (a new query id) is never mistaken for a replay.

    python jobs/queue_to_delta.py --url postgresql://... --queue Sales --table /data/bronze/sales \\
        --checkpoint /data/checkpoints/sales-bronze [--trigger available-now | --trigger 10s]
    spark-submit --properties-file conf/spark-defaults.conf --conf spark.jars.ivy=$PWD/.cache/ivy \\
        --py-files dist/spark_qtransport-*.whl jobs/queue_to_delta.py --config conf/queue_to_delta.toml

Configuration: flags, or a [queue_to_delta] table in a TOML file (--config); $SQLQUEUE_URL for --url.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _config  # noqa: E402
from _stops import STOPS  # noqa: E402

DEFAULTS: dict[str, Any] = {
    "url": os.environ.get("SQLQUEUE_URL"),
    "queue": _config.REQUIRED,
    "endpoint": "",
    "error_queue": "error",
    "table": _config.REQUIRED,
    "checkpoint": _config.REQUIRED,
    "trigger": "10s",
    "max_messages": 10_000,
    "job_id": "queue_to_delta",
}

def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = _config.stream_parser(__doc__, trigger="10s", job_id="queue_to_delta")
    p.add_argument("--queue", help="queue address to drain (NServiceBus syntax)")
    p.add_argument("--endpoint", help="consumer identity, its own per job (default: the job id)")
    return _config.parse(p, "queue_to_delta", DEFAULTS, argv)


def endpoint(args: argparse.Namespace) -> str:
    """The consumer identity: the job's own (its id) unless given. Not the queue's name, which is
    the default of every other reader of the queue (the endpoint job, the quick start in docs/getting-started.md):
    two jobs with one identity take over each other's unacknowledged claims."""
    return str(args.endpoint or args.job_id)


def bronze(messages: Any) -> Any:
    """The bronze row of each received message."""
    from pyspark.sql import functions as F

    content_type = F.lower(F.coalesce(F.col("headers").getItem("NServiceBus.ContentType"), F.lit("")))
    textual = content_type.contains("json") | content_type.startswith("text/") | content_type.contains("xml")
    return messages.select(
        "message_id", "native_id", "message_type", "correlation_id", "conversation_id", "time_sent", "intent",
        "reply_to", "headers", "body",
        F.when(textual, F.col("body").cast("string")).alias("body_text"),
        "expires", "queue", "claim_seq", "claimed_at",
        F.to_date(F.coalesce("time_sent", "claimed_at")).alias("date"),
    )


def delta_writer(table: str, job_id: str):  # type: ignore[no-untyped-def]
    """A foreachBatch function appending each batch once (Delta idempotent writes)."""
    from _spark import append_once as append

    def write(batch: Any, batch_id: int) -> None:
        append(batch, batch_id, table=table, job_id=job_id)

    return write


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    from _spark import require_delta, session

    require_delta()

    spark = session("sqlqueue-queue-to-delta")
    reader = (spark.readStream.format("sqlqueue").option("url", args.url).option("queue", args.queue)
              .option("errorQueue", args.error_queue).option("maxMessagesPerTrigger", str(args.max_messages)))
    reader = reader.option("endpoint", endpoint(args))
    query = (bronze(reader.load()).writeStream.foreachBatch(STOPS.gated(delta_writer(args.table, args.job_id)))
             .option("checkpointLocation", args.checkpoint).trigger(**_config.trigger(args.trigger))
             .queryName("queue_to_delta").start())
    print(f"draining {args.queue} into {args.table} (checkpoint {args.checkpoint})", flush=True)
    from _progress import follow

    print(follow(query).outcome, flush=True)
    return 0


if __name__ == "__main__":
    _config.exit_with(main)
