"""What a Spark task knows of the streaming query it runs for: the local properties Spark's query
thread sets on the jobs it starts (classic Spark and a query started over Spark Connect alike; a
foreachBatch function over Spark Connect runs its jobs in another server thread, without them)."""

from __future__ import annotations

__all__ = ["BATCH_ID_PROPERTY", "QUERY_ID_PROPERTY", "RUN_ID_PROPERTY", "streaming_task"]

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"  # a streaming query's run id, while it runs a batch


def streaming_task() -> tuple[str, int] | None:
    """(query id, batch id) of the streaming batch the running task belongs to; None outside one."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None
    query, batch = ctx.getLocalProperty(QUERY_ID_PROPERTY), ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if not query or batch is None:
        return None
    return str(query), int(batch)
