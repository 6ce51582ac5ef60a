"""The Spark side of sending: ``writeStream.format("sqlqueue")`` and `QueueSink` for foreachBatch.

Thin: the work is in `spark_qtransport.transport.sending.dispatch`. Which Spark calls run where:

- driver, when the query starts: ``streamWriter()`` checks the options and the input columns and
  creates the endpoint's staging and outbox tables;
- executors: ``write()`` builds one partition's messages and returns a `StagedMessage`: with
  the messages themselves when they fit the task's share of option ``inlineBytes``, else after
  staging them;
- driver, once every task of the batch succeeded: ``commit(messages, batchId)`` dispatches the
  batch in one transaction (a replayed batch id is skipped by the outbox); ``abort`` deletes
  what the tasks of a failed batch staged.

Where the streaming ids come from (the outbox keys a batch by sink name + batch id and tells a
replay from a reset checkpoint by the query id, which the checkpoint keeps across restarts):

- ``writeStream.format("sqlqueue")``, classic and Spark Connect alike: Spark passes the batch id
  to ``commit``; the tasks read the query id from their local property ``sql.streaming.queryId``
  (set by the query's thread) and report it in their `StageReport`.
- `QueueSink` in foreachBatch gets the batch id as an argument; the query id and run id come from
  `streaming_ids`: on classic Spark the driver's local properties ``sql.streaming.queryId`` and
  ``spark.jobGroup.id`` (the run id) of the query's thread; over Spark Connect (no
  ``sparkContext``; the batch's jobs run in another server thread, so tasks see no streaming
  properties) the session's active streaming query, ``df.sparkSession.streams.active``: the
  foreachBatch function's session is the one that started the query. With several active queries
  in that session, name yours: ``QueueSink(..., queryName=...)``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from ..errors import ConfigError, tagged, unwrap
from ..options.parse import WriterOptions
from ..transport import session as db
from ..transport.sending.dispatch import Dispatcher, set_up_sender
from ..transport.sending.messages import InputColumns, SendPlan, check_columns
from ..transport.sending.staging import StageReport, stage_partition
from ..transport.settings import SendSettings
from .surface import surfaced
from .tasks import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, RUN_ID_PROPERTY

try:  # pyspark >= 4.1: writers that take Arrow record batches
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchWriter
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriter

    ARROW_WRITES = True
except ImportError:  # pragma: no cover - older Spark: rows
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriter  # type: ignore[assignment]
    from pyspark.sql.datasource import DataSourceWriter as _BatchWriter  # type: ignore[assignment]

    ARROW_WRITES = False

__all__ = ["QueueSink", "SqlQueueStreamWriter", "SqlQueueWriter", "StagedMessage", "streaming_ids"]

log = logging.getLogger("spark_qtransport.sink")


_CALLED: dict[tuple[Any, ...], None] = {}  # QueueSink calls of running queries (insertion-ordered)

#: batch id staged rows of a one-off write (no stream, no QueueSink) are tagged with
ONE_OFF = -1

_SET_UP: dict[tuple[Any, ...], SendPlan] = {}  # per Python process: set up each sink (all its options) once


@dataclass
class StagedMessage(WriterCommitMessage):
    """A task's commit message: what it staged, or the messages themselves (`StageReport.inline`)."""

    report: StageReport


def prepare(options: Mapping[str, str], schema: Any) -> tuple[SendSettings, SendPlan]:
    """Validate options and input columns; set up the endpoint's tables (once per process)."""
    parsed = WriterOptions.parse(options)
    check_columns([(f.name, f.dataType.simpleString()) for f in schema.fields])
    # every option is part of the key (a notebook cell run again with another errorQueue,
    # invalidRows or contentType gets a plan of its own), but the batch a QueueSink call is for
    key = (parsed.url.key(), replace(parsed, batch_id=None, query_id=None))
    plan = _SET_UP.get(key)
    if plan is None:
        plan = _SET_UP[key] = set_up_sender(parsed)
    return parsed, plan


#: bytes of one record batch turned into Python rows at a time
ROWS_BYTES = 16 * 2**20


def _rows(iterator: Iterator[Any]) -> Iterator[Any]:
    """The task's input in batches: from Arrow record batches, `InputColumns` (the values of
    each column as Python objects, which the builder takes column by column); from Spark rows,
    row dicts.

    A record batch is turned into Python objects a slice of at most `ROWS_BYTES` at a time (one
    row at least): Spark's batches hold up to 10,000 rows, whatever their size."""
    if ARROW_WRITES:
        for batch in iterator:
            names = batch.schema.names
            for part in _slices(batch, ROWS_BYTES):
                columns = InputColumns(names, [part.column(i).to_pylist() for i in range(len(names))])
                del part
                yield columns
                del columns
    else:  # pragma: no cover
        yield (row.asDict() for row in iterator)


def _slices(batch: Any, budget: int) -> Iterator[Any]:
    """Zero-copy slices of a record batch holding about `budget` bytes each, by row sizes."""
    n = batch.num_rows
    if n <= 1 or batch.nbytes <= budget:
        yield batch
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    # variable-length columns by their values' lengths; the rest (headers map included) by average
    sizes = [0] * n
    rest = batch.nbytes
    for column in batch.columns:
        t = column.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            for i, length in enumerate(pc.binary_length(column).to_pylist()):
                if length:
                    sizes[i] += length
                    rest -= length
    share = max(0, rest) // n
    start, total = 0, 0
    for i, size in enumerate(sizes):
        size += share
        if i > start and total + size > budget:
            yield batch.slice(start, i - start)
            start, total = i, 0
        total += size
    yield batch.slice(start, n - start)


def _task_ids(options: SendSettings) -> tuple[int, str | None, int]:
    """(batch id, query id, partition) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    batch = options.batch_id
    query = options.query_id
    partition = 0
    if ctx is not None:
        local_batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if batch is None and local_batch is not None:
            batch = int(local_batch)
        query = query or ctx.getLocalProperty(QUERY_ID_PROPERTY)
        partition = ctx.partitionId()
    return (ONE_OFF if batch is None else batch), query, partition


class _Staging:
    options: SendSettings
    plan: SendPlan

    @surfaced
    def write(self, iterator: Iterator[Any]) -> StagedMessage:
        batch, query, partition = _task_ids(self.options)
        return StagedMessage(stage_partition(self.options, self.plan, _rows(iterator), batch_id=batch, query_id=query,
                                             partition=partition))

    def __repr__(self) -> str:
        o = self.options
        return f"{type(self).__name__}(endpoint={o.endpoint}, sink={o.sink!r}, url={o.url})"


def _reports(messages: list[Any]) -> list[StageReport | None]:
    return [m.report if isinstance(m, StagedMessage) else None for m in messages]


class SqlQueueStreamWriter(_Staging, _StreamWriter):
    """``writeStream.format("sqlqueue")``: exactly once per micro-batch through the outbox."""

    def __init__(self, options: SendSettings, plan: SendPlan) -> None:
        self.options = options
        self.plan = plan

    @surfaced
    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        dispatcher = Dispatcher(self.options)
        try:
            dispatcher.dispatch(int(batchId), _reports(messages), settles=True)  # its commit ends the batch
        finally:
            dispatcher.close()

    @surfaced
    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        _abort(self.options, messages)


class SqlQueueWriter(_Staging, _BatchWriter):
    """``df.write.format("sqlqueue")``: one atomic dispatch per write (used by `QueueSink`)."""

    def __init__(self, options: SendSettings, plan: SendPlan) -> None:
        self.options = options
        self.plan = plan

    @surfaced
    def commit(self, messages: list[Any]) -> None:
        dispatcher = Dispatcher(self.options)
        try:
            reports = _reports(messages)
            batch = self.options.batch_id
            if batch is None:  # in foreachBatch, tasks know the batch id; else a one-off write
                batch = next((r.batch_id for r in reports if r is not None and r.batch_id != ONE_OFF), None)
            one_off = batch is None
            if batch is None:  # a one-off write: an id no stream uses, recorded but never replayed
                batch = -secrets.randbits(62) - 2
            dispatcher.dispatch(batch, reports, query_id=self.options.query_id, settles=self.options.settles,
                                one_off=one_off)
        finally:
            dispatcher.close()

    @surfaced
    def abort(self, messages: list[Any]) -> None:
        _abort(self.options, messages)


def _abort(options: SendSettings, messages: list[Any]) -> None:
    dispatcher = Dispatcher(options)
    try:
        dispatcher.abort(_reports(messages))
    except Exception as exc:  # noqa: BLE001 - leftovers are deleted with the batch's next dispatch
        log.warning("could not delete what a failed batch staged: %s", db.describe(options.dialect, exc))
    finally:
        dispatcher.close()


def _is_connect(spark: Any) -> bool:
    """A Spark Connect session (no ``sparkContext``), without importing Connect's client."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def streaming_ids(df: Any, query_name: str | None = None) -> tuple[str | None, str | None]:
    """(query id, run id) of the streaming query whose foreachBatch function got `df`; (None,
    None) outside a stream. Classic Spark: the local properties of the query's thread (the one
    calling the function). Spark Connect: the session's active query (the one named `query_name`
    if given); with several, which one runs this batch is unknowable, so `query_name` is needed."""
    spark = df.sparkSession
    if not _is_connect(spark):
        sc = spark.sparkContext
        return sc.getLocalProperty(QUERY_ID_PROPERTY), sc.getLocalProperty(RUN_ID_PROPERTY)
    active = spark.streams.active
    if query_name is not None:
        active = [q for q in active if q.name == query_name]
        if not active:
            raise ConfigError(f"no active streaming query named {query_name!r} in this Spark Connect session")
    if len(active) > 1:
        raise ConfigError(
            f"{len(active)} streaming queries are active in this Spark Connect session: name the query "
            "(writeStream.queryName(...)) and pass the name (QueueSink(..., queryName=...)), so the batch is "
            "recorded under its query's id"
        )
    return (str(active[0].id), str(active[0].runId)) if active else (None, None)


class QueueSink:
    """A foreachBatch function that sends a micro-batch's rows, exactly once per batch id.

    Example::

        def handle(batch, batch_id):
            batch.write.format("delta").option("txnAppId", "orders").option("txnVersion", batch_id).save(path)
            QueueSink(url=url, endpoint="Sales")(replies_of(batch), batch_id)

        stream.writeStream.foreachBatch(handle).option("checkpointLocation", ckpt).start()

    or, when the queues are the only output, ``foreachBatch(QueueSink(url=url, endpoint="Sales", settles=True))``.
    Options are those of ``writeStream.format("sqlqueue")`` (keyword names as documented), plus
    ``queryName``: over Spark Connect, the name of the streaming query calling the sink, needed
    only when its session runs several queries (see `streaming_ids`); and ``settles``: this call
    is the batch's last output, so its dispatch settles the claims the batch read: a query stopped
    or killed right after the batch never has them delivered again, to any query of the endpoint
    (the stream writer always does; a QueueSink followed by other writes must not, or a takeover
    would skip those writes).
    """

    def __init__(self, url: str | None = None, *, endpoint: str, queryName: str | None = None,  # noqa: N803
                 settles: bool = False, **options: Any) -> None:
        self.query_name = queryName
        self.settles = settles
        self.options = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items() if v is not None}
        if url is not None:
            self.options["url"] = url
        self.options["endpoint"] = endpoint
        WriterOptions.parse(self.options)  # bad options fail here, not in the first batch

    def _once_per_batch(self, run_id: str | None, batch_id: int) -> None:
        """Two calls for one batch with the same sink name would make the second look like a
        replay, and the outbox would skip it: refuse that instead of losing its messages."""
        if not run_id:
            return
        o = WriterOptions.parse(self.options)
        key = (run_id, o.url.key(), o.endpoint, o.sink, int(batch_id))
        if key in _CALLED:
            raise ConfigError(
                f"QueueSink for endpoint {o.endpoint} with sinkName {o.sink!r} was called twice in batch {batch_id}: "
                "the outbox would take the second call for a replay and skip it. Give each QueueSink of a "
                "batch its own sinkName, or send everything with one call"
            )
        _CALLED[key] = None
        while len(_CALLED) > 10_000:
            del _CALLED[next(iter(_CALLED))]

    def __repr__(self) -> str:
        o = WriterOptions.parse(self.options)
        return f"QueueSink(endpoint={o.endpoint}, sink={o.sink!r}, url={o.url})"

    def __call__(self, df: Any, batch_id: int) -> None:
        from .. import register

        # the batch's session (over Connect, the foreachBatch worker's own): the source only; a
        # failure listener there would start a listener stream inside every batch
        register(df.sparkSession, report_failures=False)
        query_id, run_id = streaming_ids(df, self.query_name)
        self._once_per_batch(run_id, batch_id)
        writer = df.write.format("sqlqueue").mode("append").options(**self.options).option("_batchId", str(int(batch_id)))
        if query_id:
            writer = writer.option("_queryId", query_id)
        if self.settles:
            writer = writer.option("_settles", "true")
        try:
            writer.save()
        except Exception as exc:
            # Spark's exception holds our error as text, traceback and all: raise our error itself
            # (a foreachBatch function may catch it; Spark reports it in one line)
            ours = unwrap(exc)
            if ours is None:
                raise
            raise tagged(ours) from None
