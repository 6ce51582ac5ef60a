"""The Spark side of receiving: ``spark.readStream.format("sqlqueue")``. Thin: the work is in
transport/receiving/.

Which Spark calls run where (pyspark 4.2 Python Data Source API):

- driver, one long-lived Python process per query: ``initialOffset``, ``latestOffset`` (claims),
  ``partitions``, ``commit`` (acknowledges), ``reportLatestOffset``, ``stop``;
- executors: ``read``, on a pickled copy of this reader that never opened a connection.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import __version__ as PYSPARK_VERSION
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..errors import ConfigError
from ..options.parse import ReaderOptions
from ..transport.receiving.admission import TriggerGate
from ..transport.receiving.queueset import QueueSet
from ..transport.receiving.receiver import ClaimSlice, pack, read_batches, read_slice
from ..transport.receiving.slices import RowSizes, record_batch
from ..transport.session import OUTAGES
from ..transport.settings import MAX_AUTO_PARTITIONS, PARTITION_TARGET_ROWS, ReceiveSettings, StreamSettings
from .schema import ARROW_READS, ARROW_SCHEMA, SCHEMA
from .surface import surfaced
from .tasks import streaming_task

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    HAS_ADMISSION_CONTROL = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

    ReadLimit = ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]

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
        ReaderOptions.stream(self.options)
        return SCHEMA

    # Spark calls these in the process that plans the query (the executors get the reader and
    # writer pickled): a database that never answers there fails the start in seconds
    # (`OUTAGES.starts_here`), not after the outage bound.

    @surfaced
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        OUTAGES.starts_here()
        return SqlQueueStreamReader(ReaderOptions.stream(self.options))

    @surfaced
    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import SqlQueueStreamWriter, prepare

        OUTAGES.starts_here()
        return SqlQueueStreamWriter(*prepare(self.options, schema))

    @surfaced
    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import SqlQueueWriter, prepare

        OUTAGES.starts_here()
        return SqlQueueWriter(*prepare(self.options, schema))

    @surfaced
    def reader(self, schema: StructType) -> Any:
        # Receiving deletes messages, so it needs Spark's checkpoints to be safe.
        raise ConfigError(
            "format 'sqlqueue' receives as a stream only: use spark.readStream.format('sqlqueue') "
            "(with Trigger.AvailableNow for a one-off drain)"
        )


class _SlicePartition(InputPartition):
    """One Spark task: one slice, or several queues' small slices (`pack`), read in turn."""

    def __init__(self, parts: list[ClaimSlice]) -> None:
        super().__init__(parts)
        self.parts = parts

    def __repr__(self) -> str:
        shown = ", ".join(repr(p) for p in self.parts[:3])
        return shown + (f" and {len(self.parts) - 3} more" if len(self.parts) > 3 else "")


class SqlQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Claims on the driver, reads slices on executors, acknowledges on commit, through a
    `QueueSet` (one queue or several; offsets ``{"claim": N, ...}`` for one queue, ``{"queues":
    {...}}``, one position per queue, for several)."""

    def __init__(self, options: ReceiveSettings | StreamSettings) -> None:
        self.stream = options if isinstance(options, StreamSettings) else StreamSettings.of(options)
        #: the one queue's settings, or None for several
        self.options = self.stream.single
        self._source: QueueSet | None = None
        m = self.stream.min_messages
        self._gate = None if m is None else TriggerGate(m, self.stream.max_trigger_delay)
        self._available_now = False
        # Spark 4.0/4.1 (no admission control) call latestOffset() without a start: the reader
        # keeps what Spark will start the next batch from (`_next_start`), learns a restarted
        # run's position from its first batch (`_first_batch`), and tags this run's offsets
        # (`_run`) so that first batch is always planned (see `_first_batch`)
        self._next_start: dict[str, Any] | None = None
        self._run: str | None = None
        self._fresh = False  # initialOffset() was called: a new checkpoint
        self._started = False  # this run's first batch was planned
        self._ack_in_foreground = False

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy for read(): no connection, no driver state.
        return {"stream": self.stream, "options": self.options, "_source": None, "_gate": None,
                "_available_now": False, "_next_start": None, "_run": None, "_fresh": False,
                "_started": False, "_ack_in_foreground": False}

    def __repr__(self) -> str:
        o = self.options
        if o is None:
            return f"SqlQueueStreamReader(queues={self.stream.describe()}, url={self.stream.url})"
        return f"SqlQueueStreamReader(queue={o.queue}, endpoint={o.consumer!r}, url={o.url})"

    @property
    def source(self) -> QueueSet:
        if self._source is None:
            self._source = QueueSet(self.stream)
        return self._source

    def _offset(self, d: dict[str, Any]) -> Any:
        return self.source.offset(d)

    # -- driver --------------------------------------------------------------------------------

    @surfaced
    def initialOffset(self) -> dict[str, Any]:
        self._fresh = True
        source = self.source
        return source.encode(source.initial_offset())

    @surfaced
    def getDefaultReadLimit(self) -> Any:
        if self.stream.min_messages is not None:
            return ReadMinRows(self.stream.min_messages)  # at most maxMessagesPerTrigger still
        return ReadMaxRows(self.stream.max_messages)

    @surfaced
    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        if HAS_ADMISSION_CONTROL:
            self._committed(start)
            return self._latest(start, limit)
        # Spark 4.0/4.1: no start given. Spark starts the next batch from the offset returned
        # last (or from the end of a batch it replayed): pass that on as the start
        if self._next_start is None:
            end = self._first_batch()
        else:
            self._committed(self._next_start)
            end = self._latest(self._next_start, None)
        self._next_start = end if self._run is None else {**end, "run": self._run}
        return self._next_start

    def _committed(self, start: dict[str, Any] | None) -> None:
        """Spark asks for the next offset only once every batch up to `start` is in its commit
        log (a restart first replays a batch it had not committed): acknowledge up to `start` now,
        so a batch is acknowledged within one trigger interval of its commit whether or not new
        messages arrive. Spark's own ``commit(end)`` comes only with the next batch."""
        if start is not None:
            self.source.committed(self._offset(start))

    def _first_batch(self) -> dict[str, Any]:
        """Spark 4.0/4.1, the first trigger of a run that replayed no batch: the claims this
        endpoint holds and every message waiting now, as one batch (`Receiver.first_batch`).

        The offset Spark committed last is not given to the source here, so this batch is what
        tells it (as ``partitions(start, end)``); its ``run`` tag differs from every earlier
        run's, so Spark always plans it, even when nothing is new, and ``commit`` of the last
        run's last batch arrives with it: nothing stays claimed past one restart. And as Spark
        runs ``Trigger.AvailableNow`` (and ``Trigger.Once``) as a single batch on these versions,
        this batch is what drains the queue to where it stood at the start.
        """
        self._run = uuid.uuid4().hex[:12]
        self._ack_in_foreground = True  # the previous run's last batch, before this run may end
        before = self.source.claimed
        end = self.source.encode(self.source.first_batch(fresh=self._fresh))
        taken = self.source.claimed - before
        # a warning where maxMessagesPerTrigger was not kept, else a note
        log.log(
            logging.WARNING if taken > self.stream.max_messages else logging.INFO,
            "Spark %s gives Python sources no admission control: the first batch of this run of %s takes the %d "
            "message(s) waiting at its start (Trigger.AvailableNow, which Spark runs as one batch here, drains "
            "the queue so); maxMessagesPerTrigger (%d) applies from the next batch",
            PYSPARK_VERSION, self.stream.describe(), taken, self.stream.max_messages,
        )
        return end

    def _latest(self, start: dict[str, Any] | None, limit: Any) -> dict[str, Any]:
        begin = self._offset(start) if start is not None else None
        rows: int | None = self.stream.max_messages
        least = self.stream.min_messages
        if HAS_ADMISSION_CONTROL and isinstance(limit, ReadAllAvailable):
            rows = least = None
        elif HAS_ADMISSION_CONTROL and isinstance(limit, ReadMaxRows):
            rows = max(1, int(limit.max_rows))
        elif HAS_ADMISSION_CONTROL and isinstance(limit, ReadMinRows):
            least = int(limit.min_rows)
        counted = False

        def waiting() -> int:
            nonlocal counted
            counted = True
            return self.source.waiting(begin)

        if (self._gate is not None and least is not None and begin is not None and not self._available_now
                and not self._gate.admit(waiting, min_messages=least)):
            return start  # type: ignore[return-value] # fewer than minMessagesPerTrigger wait: no batch yet
        # a batch minMessagesPerTrigger admitted is claimed whole: what it waited for is there
        source = self.source
        return source.encode(source.latest(begin, rows, whole=self._gate is not None, counted=counted))

    @surfaced
    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True  # minMessagesPerTrigger would never end the run
        self.source.prepare_available_now()

    @surfaced
    def reportLatestOffset(self) -> dict[str, Any] | None:
        # Shown as the source's latestOffset in query progress: the planned end plus the queue's
        # backlog and this run's expired/poison counts (the metric the Python API can report),
        # named by queue and endpoint: a query's progress says which queue it reads.
        report = self.source.report()
        if self._gate is not None:
            report["triggersHeldBack"] = self._gate.held
        return report

    @surfaced
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # Spark 4.0 asks for the slices of (end, end] of the last logged batch when a run starts
        # (no batch: it says nothing); a replayed batch's end is where the next starts
        if not HAS_ADMISSION_CONTROL and start != end:
            self._next_start = end
            if self._run is not None and end.get("run") == self._run and not self._started:
                # this run's first batch (`_first_batch`): Spark planned it after committing
                # `start`, which it gives only here; the batch may end below it
                self._started = True
                self.source.processed(self._offset(start))
        parts = self.source.slices(self._offset(start), self._offset(end))
        return [_SlicePartition(group) for group in pack(parts, PARTITION_TARGET_ROWS, MAX_AUTO_PARTITIONS)]

    @surfaced
    def commit(self, end: dict[str, Any]) -> None:
        # Acknowledging runs in the background: Spark's next batch does not wait for the deletes.
        # Not the previous run's last batch on Spark 4.0/4.1 (see `_first_batch`): this run may
        # be that one batch, and its process may end without waiting for a thread.
        foreground, self._ack_in_foreground = self._ack_in_foreground, False
        self.source.ack(self._offset(end), background=not foreground)

    @surfaced
    def stop(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    # -- executors -----------------------------------------------------------------------------

    @surfaced
    def read(self, partition: InputPartition) -> Iterator[Any]:
        # Arrow record batches built column by column (transport.receiving.decode): Spark takes them
        # as they are. pyspark keeps the first batch a read yields referenced until the read ends:
        # make it empty.
        parts: list[ClaimSlice] = partition.parts  # type: ignore[attr-defined]
        ids = streaming_task()
        if ids is not None:  # the claims of the batch, for the sink to settle (transport.settled)
            record_batch(parts, query_id=ids[0], batch_id=ids[1])
        sizes = RowSizes()  # a slice's first fetch sized by the rows of those read before it
        if not ARROW_READS:  # Spark 4.0/4.1: plain rows, converted by Spark
            for part in parts:
                yield from read_slice(part, sizes)
            return
        yield pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        for part in parts:
            yield from read_batches(part, sizes)
