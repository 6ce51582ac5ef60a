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
    OffsetError,
    QTransportError,
    QueueNotFoundError,
    SchemaError,
)

__all__ = [
    "register",
    "ConfigError",
    "ConsumerBusyError",
    "OffsetError",
    "QTransportError",
    "QueueNotFoundError",
    "SchemaError",
    "__version__",
]

__version__ = "0.1.0"


def register(spark: Any) -> None:
    """Register the ``sqlqueue`` data source with a SparkSession (needed once per session)."""
    from .source import SqlQueueDataSource

    spark.dataSource.register(SqlQueueDataSource)
