"""The Spark side of receiving: ``spark.readStream.format("sqlqueue")``. Thin: the work is in
transport/receiving/.

Which Spark calls run where (pyspark 4.2 Python Data Source API):

- driver, one long-lived Python process per query: ``initialOffset``, ``latestOffset`` (claims),
  ``partitions``, ``commit`` (acknowledges), ``reportLatestOffset``, ``stop``;
- executors: ``read``, on a pickled copy of this reader that never opened a connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..transport.receiving.receiver import ClaimOffset, ClaimSlice, Receiver, read_batches, read_slice
from ..transport.settings import ReceiveSettings
from .options import ReaderOptions
from .schema import ARROW_READS, ARROW_SCHEMA, SCHEMA
from .surface import surfaced

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    HAS_ADMISSION_CONTROL = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

__all__ = ["SqlQueueDataSource", "SqlQueueStreamReader", "SCHEMA"]

log = logging.getLogger("spark_qtransport.source")

class SqlQueueDataSource(DataSource):
    """``format("sqlqueue")``: NServiceBus SQL Server / PostgreSQL transport queues."""

    @classmethod
    def name(cls) -> str:
        return "sqlqueue"

    @surfaced
    def schema(self) -> StructType:
        # Spark asks for the schema at load(): validating here makes a bad option fail before
        # the query starts, with a message that names the option.
        ReaderOptions.parse(self.options)
        return SCHEMA

    @surfaced
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SqlQueueStreamReader(ReaderOptions.parse(self.options))

    @surfaced
    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import SqlQueueStreamWriter, prepare

        return SqlQueueStreamWriter(*prepare(self.options, schema))

    @surfaced
    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import SqlQueueWriter, prepare

        return SqlQueueWriter(*prepare(self.options, schema))

    @surfaced
    def reader(self, schema: StructType) -> Any:
        # Receiving deletes messages, so it needs Spark's checkpoints to be safe.
        raise ConfigError(
            "format 'sqlqueue' receives as a stream only: use spark.readStream.format('sqlqueue') "
            "(with Trigger.AvailableNow for a one-off drain)"
        )


class _SlicePartition(InputPartition):
    def __init__(self, part: ClaimSlice) -> None:
        super().__init__(part)
        self.part = part

    def __repr__(self) -> str:
        return repr(self.part)


class SqlQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Claims on the driver, reads slices on executors, acknowledges on commit."""

    def __init__(self, options: ReceiveSettings) -> None:
        self.options = options
        self._receiver: Receiver | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy for read(): no connection, no driver state.
        return {"options": self.options, "_receiver": None}

    def __repr__(self) -> str:
        return f"SqlQueueStreamReader(queue={self.options.queue}, endpoint={self.options.consumer!r}, url={self.options.url})"

    @property
    def receiver(self) -> Receiver:
        if self._receiver is None:
            self._receiver = Receiver(self.options)
        return self._receiver

    # -- driver --------------------------------------------------------------------------------

    @surfaced
    def initialOffset(self) -> dict[str, Any]:
        return self.receiver.initial_offset().to_dict()

    @surfaced
    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.options.max_messages)

    @surfaced
    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        begin = ClaimOffset.from_dict(start) if start is not None else None
        if not HAS_ADMISSION_CONTROL or limit is None:
            rows: int | None = self.options.max_messages
        elif isinstance(limit, ReadAllAvailable):
            rows = None
        elif isinstance(limit, ReadMaxRows):
            rows = max(1, int(limit.max_rows))
        else:
            rows = self.options.max_messages
        return self.receiver.latest(begin, rows).to_dict()

    @surfaced
    def prepareForTriggerAvailableNow(self) -> None:
        self.receiver.prepare_available_now()

    @surfaced
    def reportLatestOffset(self) -> dict[str, Any] | None:
        # Shown as the source's latestOffset in query progress: the planned end plus the queue's
        # backlog and this run's expired/poison counts (the metric the Python API can report),
        # named by queue and endpoint: a query's progress says which queue it reads.
        r = self.receiver
        return {**r.report(), "backlog": r.reported_backlog(), "queue": r.dialect.format_address(self.options.queue),
                "endpoint": self.options.consumer}

    @surfaced
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [_SlicePartition(p) for p in self.receiver.slices(ClaimOffset.from_dict(start), ClaimOffset.from_dict(end))]

    @surfaced
    def commit(self, end: dict[str, Any]) -> None:
        # Acknowledging runs in the background: Spark's next batch does not wait for the deletes.
        self.receiver.ack(ClaimOffset.from_dict(end), background=True)

    @surfaced
    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    # -- executors -----------------------------------------------------------------------------

    @surfaced
    def read(self, partition: InputPartition) -> Iterator[Any]:
        # Arrow record batches built column by column (transport.receiving.decode): Spark takes them
        # as they are. pyspark keeps the first batch a read yields referenced until the read ends:
        # make it empty.
        part: ClaimSlice = partition.part  # type: ignore[attr-defined]
        if not ARROW_READS:  # Spark 4.0/4.1: plain rows, converted by Spark
            yield from read_slice(part)
            return
        yield pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        yield from read_batches(part)
