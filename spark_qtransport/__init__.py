"""spark-qtransport: Spark Structured Streaming on NServiceBus SQL Server / PostgreSQL transport queues.

Example::

    from spark_qtransport import register
    register(spark)
    df = (spark.readStream.format("sqlqueue")
          .option("url", "postgresql://postgres@127.0.0.1:5432/postgres")
          .option("queue", "Sales")
          .load())
"""

from __future__ import annotations

from typing import Any

from .errors import (
    ConfigError,
    ConsumerBusyError,
    DatabaseError,
    DispatchError,
    MessageError,
    OffsetError,
    OutboxConflictError,
    QTransportError,
    QueueNotFoundError,
    SchemaError,
    unwrap,
)
from .spark.columns import fail, publish, reply, retry_later
from .spark.platform import platform_columns, utc_date

__all__ = [
    "register",
    "QueueSink",
    "reply",
    "publish",
    "fail",
    "retry_later",
    "platform_columns",
    "utc_date",
    "streaming_ids",
    "DatabaseError",
    "DispatchError",
    "OutboxConflictError",
    "ConfigError",
    "ConsumerBusyError",
    "OffsetError",
    "QTransportError",
    "QueueNotFoundError",
    "SchemaError",
    "MessageError",
    "unwrap",
    "__version__",
]

__version__ = "0.1.0"


def register(spark: Any, *, report_failures: bool = True) -> None:
    """Register the ``sqlqueue`` data source with a SparkSession (needed once per session). With
    `report_failures` (the default) any query of a classic session that fails logs one line
    saying why, awaited or not (`spark.failures`). Over Spark Connect call
    `spark_qtransport.spark.failures.report_failures(spark)` for it: a Connect listener keeps a
    gRPC stream open, and a process that forks while gRPC threads run can crash the child."""
    from .spark.reader import SqlQueueDataSource

    spark.dataSource.register(SqlQueueDataSource)
    if report_failures and not type(spark).__module__.startswith("pyspark.sql.connect"):
        from .spark.failures import report_failures as add_listener

        add_listener(spark)


def __getattr__(name: str) -> Any:
    # QueueSink and streaming_ids import pyspark: load them on first use, so `import spark_qtransport`
    # works without Spark.
    if name in ("QueueSink", "streaming_ids"):
        from .spark import writer

        return getattr(writer, name)
    raise AttributeError(f"module 'spark_qtransport' has no attribute {name!r}")
