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

    try:
        spark.dataSource.register(SqlQueueDataSource)
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
        from .spark.versions import classpath_problem

        problem = classpath_problem(spark)
        if problem is None:
            raise
        raise ConfigError(
            f"Spark cannot load the data sources on its classpath ({problem}), so it takes 'sqlqueue' for one "
            f"that exists: a jar built for another Spark line (this is pyspark {spark.version}). With "
            "SPARK_CONF_DIR=conf/local, run `make setup` again after changing pyspark; else check spark.jars "
            "and spark.jars.packages") from None
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
