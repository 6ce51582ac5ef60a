"""Drain the Particular platform's audit and error queues into two Delta tables, exactly once.

What ServiceControl ingests, as tables: every message an endpoint audited (the ``audit`` queue)
becomes a row of the ``audit`` table, every message an endpoint gave up on (the ``error`` queue) a
row of the ``failures`` table, each with the platform's columns (`spark_qtransport.platform_columns`:
times, durations, endpoints, the failure, ServiceControl's unique message id) beside its headers
and body, partitioned by ``day`` (UTC: the audit copy's ProcessingEnded, the failure's
TimeOfFailure, else the day it was read). One streaming query reads every queue; each micro-batch
is split by the queue each row came from and appended to both tables with Delta's idempotent
writes (``txnAppId`` = job id + the query's id, ``txnVersion`` = batch id), as
jobs/queue_to_delta.py does: a batch Spark replays after a crash is not appended twice.

    python jobs/audit_to_delta.py --url postgresql://... --table-dir /data/platform \\
        --checkpoint /data/checkpoints/platform [--audit-queue audit --error-queue error] \\
        [--trigger available-now | --trigger 10s]

Configuration: flags, or an [audit_to_delta] table in a TOML file (--config); $SQLQUEUE_URL for --url.
The job consumes the queues: ServiceControl must not read them too (use its forwarding queues, or
give this job the queues it forwards to).
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

JOB = "audit_to_delta"

DEFAULTS: dict[str, Any] = {
    "url": os.environ.get("SQLQUEUE_URL"),
    "audit_queue": "audit",
    "error_queue": "error",
    "poison_queue": "",
    "endpoint": "",
    "table_dir": "",
    "audit_table": "",
    "failures_table": "",
    "checkpoint": _config.REQUIRED,
    "trigger": "10s",
    "max_messages": 10_000,
    "job_id": JOB,
}

#: the tables' columns, in order (the stream's, the platform's, the partition)
COLUMNS = (
    "queue", "message_id", "message_type", "headers", "body",
    "time_sent", "processing_started", "processing_ended", "processing_time", "critical_time", "delivery_time",
    "originating_endpoint", "processing_endpoint", "message_intent", "retries", "failed_q",
    "exception_type", "exception_message", "time_of_failure", "unique_message_id",
    "day",
)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = _config.stream_parser(__doc__, trigger="10s", job_id=JOB, table=False,
                              error_queue="error queue(s) to read into the failures table, comma-separated (default: error)")
    p.add_argument("--audit-queue", help="audit queue(s) to read into the audit table, comma-separated (default: audit)")
    p.add_argument("--poison-queue", help="where a row no reader can take goes (headers that are not a JSON object "
                                          "of strings), created if missing (default: <first error queue>.Poison "
                                          "beside it)")
    p.add_argument("--endpoint", help="consumer identity, its own per job (default: the job id)")
    p.add_argument("--table-dir", help="directory of the two tables: <dir>/audit and <dir>/failures")
    p.add_argument("--audit-table", help="path of the audit table (default: <table-dir>/audit)")
    p.add_argument("--failures-table", help="path of the failures table (default: <table-dir>/failures)")
    args = _config.parse(p, JOB, DEFAULTS, argv)
    for flag in ("audit", "failures"):
        if not (getattr(args, f"{flag}_table") or args.table_dir):
            p.error(f"missing --table-dir or --{flag}-table (a flag or a key in --config)")
    try:
        audit, errors, poison = queues(args)
    except ValueError as exc:
        p.error(str(exc))
    if set(audit) & set(errors):
        p.error(f"--audit-queue and --error-queue name the same queue: {', '.join(sorted(set(audit) & set(errors)))}")
    if poison in (*audit, *errors):
        p.error(f"--poison-queue must be another queue than the ones the job reads: {poison}")
    return args


def queues(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """The audit queues, the error queues and the poison queue, each address as the stream's
    ``queue`` column spells it (the dialect's canonical text: ``"public"."audit"``, ``audit@[dbo]``).
    A poison row cannot go to the error queue here: the job reads it."""
    from spark_qtransport.connections import parse_url
    from spark_qtransport.dialects import dialect_for
    from spark_qtransport.errors import ConfigError

    d = dialect_for(parse_url(str(args.url), option="--url"))

    def canonical(text: str, flag: str) -> list[str]:
        names = [q.strip() for q in str(text).split(",") if q.strip()]
        if not names:
            raise ValueError(f"{flag} names no queue")
        try:
            return [d.format_address(d.parse_address(q, option=flag)) for q in names]
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc

    errors = canonical(args.error_queue, "--error-queue")
    try:
        poison = (canonical(args.poison_queue, "--poison-queue")[0] if args.poison_queue
                  else d.format_address(d.companion(d.parse_address(errors[0]), "Poison")))
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    return canonical(args.audit_queue, "--audit-queue"), errors, poison


def tables(args: argparse.Namespace) -> dict[str, str]:
    """{"audit": path, "failures": path}."""
    return {name: str(getattr(args, f"{name}_table") or Path(str(args.table_dir)) / name) for name in ("audit", "failures")}


def endpoint(args: argparse.Namespace) -> str:
    """The consumer identity: the job's own (its id) unless given, as in jobs/queue_to_delta.py."""
    return str(args.endpoint or args.job_id)


def platform_rows(messages: Any, error_queues: list[str]) -> Any:
    """The tables' rows (`COLUMNS`) of received messages; ``failure`` says which table each is for."""
    from pyspark.sql import functions as F

    from spark_qtransport import platform_columns, utc_date

    failure = F.col("queue").isin(*error_queues)
    rows = platform_columns(messages)
    day = F.coalesce(F.when(failure, F.col("time_of_failure")).otherwise(F.col("processing_ended")), F.col("claimed_at"))
    return rows.select(*COLUMNS[:-1], utc_date(day).alias("day"), failure.alias("failure"))


def platform_tables_writer(paths: dict[str, str], job_id: str):  # type: ignore[no-untyped-def]
    """A foreachBatch function appending each batch's audit rows and failures once to their
    tables (Delta idempotent writes, one transaction per table; both tables are written even when
    one gets no rows, so both exist once the first batch is in)."""
    from _spark import append_once as append
    from pyspark.sql import functions as F

    def write(batch: Any, batch_id: int) -> None:
        rows = batch.persist()  # read the batch once, split it twice
        try:
            for name, rows_of in (("failures", F.col("failure")), ("audit", ~F.col("failure"))):
                append(rows.where(rows_of).drop("failure"), batch_id, table=paths[name], job_id=job_id,
                       partition="day", query_name=JOB)
        finally:
            rows.unpersist()

    return write


def messages(spark: Any, args: argparse.Namespace, names: list[str], poison: str) -> Any:
    """One stream of every queue's messages (the reader's `queue` option lists them all)."""
    return (spark.readStream.format("sqlqueue").option("url", args.url).option("queue", ", ".join(names))
            .option("errorQueue", poison).option("maxMessagesPerTrigger", str(args.max_messages))
            .option("endpoint", endpoint(args)).option("retryAcknowledgements", "false").load())


def count(spark: Any, path: str) -> int:
    """Rows of a Delta table, 0 if it does not exist yet."""
    if not (Path(path) / "_delta_log").exists():
        return 0
    return int(spark.read.format("delta").load(path).count())


def run(spark: Any, args: argparse.Namespace) -> dict[str, int]:
    """Run the job on `spark` until its query ends (AvailableNow: once drained); the rows it added
    to each table: {"audit": n, "failures": m}."""
    from spark_qtransport.connections import parse_url
    from spark_qtransport.transport import create_queues

    audit, errors, poison = queues(args)
    create_queues(parse_url(str(args.url), option="--url"), poison)
    paths = tables(args)
    before = {name: count(spark, path) for name, path in paths.items()}
    rows = platform_rows(messages(spark, args, [*audit, *errors], poison), errors)
    query = (rows.writeStream.foreachBatch(STOPS.gated(platform_tables_writer(paths, args.job_id)))
             .option("checkpointLocation", args.checkpoint).trigger(**_config.trigger(args.trigger))
             .queryName(JOB).start())
    print(f"draining {', '.join(audit)} into {paths['audit']} and {', '.join(errors)} into {paths['failures']} "
          f"(checkpoint {args.checkpoint})", flush=True)
    from _progress import follow, plural

    summary = follow(query)
    added = {name: count(spark, path) - before[name] for name, path in paths.items()}
    print(f"{summary.outcome}; audit +{plural(added['audit'], 'row')}, failures +{plural(added['failures'], 'row')}",
          flush=True)
    return added


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    from _spark import require_delta, session

    require_delta()

    run(session("sqlqueue-audit-to-delta"), args)
    return 0


if __name__ == "__main__":
    _config.exit_with(main)
